/* Small facts about processes that several launcher files need: a variable
 * of an environment array, signal names and numbers, the shell-style exit
 * code of a wait status, and a process's start time (which, with its pid,
 * tells a live launcher from a later process that reused the pid). */
#ifndef MG_PROC_H
#define MG_PROC_H

#include <stddef.h>
#include <sys/types.h>

/* Value of name in an envp array, or NULL. */
const char *mg_env_get(char *const *env, const char *name);
/* The same, from the process environment when env is NULL. */
const char *mg_env_lookup(char *const *env, const char *name);

/* Reads a small file (a /proc or /sys one) into buf, at most cap - 1 bytes,
 * NUL-terminated. Returns the length, or -1. */
ssize_t mg_read_small(const char *path, char *buf, size_t cap);

/* Numeric field `field` (4 and up, numbered as in proc(5)) of /proc/<pid>/stat,
 * or -1. */
long long mg_proc_stat_field(int pid, int field);

/* When process pid started, in clock ticks after boot (field 22): with the
 * pid, it names a process even after the pid is reused. -1 if unknown. */
long long mg_proc_start_time(int pid);

/* 1 when the process has begun to exit (the kernel's PF_EXITING: its files,
 * sockets included, may be closed already) or is a zombie; 0 when not; -1
 * when it cannot be told (gone, no /proc). */
int mg_proc_exiting(int pid);

/* "SIGSEGV" (or "SIG62"); buf is used for unnamed ones. */
const char *mg_signame(int sig, char *buf, size_t cap);
/* Parses "SIGTERM", "TERM" or "15". Returns the number or -EINVAL. */
int mg_signum(const char *name);
/* Whether process group pgid has a member that is not a zombie. */
int mg_proc_group_alive(int pgid);

/* Shell-style code for a wait status: the exit code, or 128+signal. */
int mg_status_code(int wstatus);

/* The exit status of the "do not retry" class (docs/cli.md#exit-code): a
 * usage or configuration error (argparse's, train's bad flags, a checkpoint
 * that does not fit the run), which a restart would meet again. A worker
 * that exits with it is not restarted, and the run ends with it, so that a
 * Job's podFailurePolicy can fail the job rather than recreate the pod. */
#define MG_EXIT_NO_RETRY 2

#endif
