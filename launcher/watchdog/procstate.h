/* What the kernel says a process is doing, for the watchdog's line: its
 * state letter (/proc/PID/stat: running, sleeping, in uninterruptible
 * sleep, stopped) and where it sleeps in the kernel (/proc/PID/wchan); a
 * variable of its environment. */
#ifndef MG_PROCSTATE_H
#define MG_PROCSTATE_H

#include <stddef.h>

struct mg_procstate {
    char state;     /* R, S, D, T, t, Z, X, ... or 0 when unknown (gone) */
    char wchan[64]; /* the kernel function it sleeps in, "" when none or unreadable */
};

/* Reads pid's state under root (NULL: "/"). 0, or -ESRCH when it is gone. */
int mg_procstate_read(const char *root, int pid, struct mg_procstate *ps);

/* "stopped (SIGSTOP or a debugger)", "sleeping in the kernel (pipe_read)",
 * "running (on a CPU or ready)": into buf; returns buf. */
const char *mg_procstate_text(const struct mg_procstate *ps, char *buf, size_t cap);

/* Whether the state is stopped (T, t): it gets SIGCONT with a stop signal. */
int mg_procstate_stopped(const struct mg_procstate *ps);

/* The value of name in pid's environment as it started (/proc/PID/environ,
 * read whole: a pod's or a Slurm step's passes 64 KiB, and mglaunch's own
 * entries come last) into out. 0, -ENOENT when absent, -ENAMETOOLONG when
 * longer than cap, or a negative errno (-EACCES: another user's). */
int mg_procenv_get(int pid, const char *name, char *out, size_t cap);

#endif
