/* Stacks of a hung job's workers: every thread's native frames, taken by a
 * tool from Debian (elfutils' eu-stack, else gdb in batch mode) that
 * attaches briefly with ptrace and detaches, into a file of the attempt's
 * directory. The tools run as children of the agent, so its loop never
 * waits on them; watch.c starts them and waits with a deadline. */
#ifndef MG_STACKS_H
#define MG_STACKS_H

#include <stddef.h>
#include <sys/types.h>

#define MG_STACKS_TIMEOUT_MS 10000 /* a tool still running then is killed */

struct mg_stack_tool {
    char path[4096]; /* "" when none is installed */
    int gdb;         /* gdb, not eu-stack */
};

/* Looks for eu-stack, then gdb, in path_env (PATH). 0, or -ENOENT. */
int mg_stacks_find(const char *path_env, struct mg_stack_tool *t);

/* Starts the tool on pid, its output (after header) into the file out
 * (created, never overwritten: -EEXIST). 0 and *child, or a negative errno. */
int mg_stacks_start(const struct mg_stack_tool *t, int pid, const char *out, const char *header,
                    char *const *envp, pid_t *child);

/* For a process in uninterruptible sleep (D), which ptrace cannot stop:
 * header and the kernel's stack (/proc/PID/stack, root only) into out. 0
 * or a negative errno. */
int mg_stacks_kernel(int pid, const char *out, const char *header);

/* 1 when the tool has exited (reaped here or by the agent's own reaping),
 * 0 while it runs. */
int mg_stacks_done(pid_t child);

/* What the file says after the tool exited: 0 when it holds frames, else a
 * negative code with why ("ptrace was refused: ...", "no frames"). */
int mg_stacks_check(const char *out, char *why, size_t cap);

#endif
