/* What the kernel says a process is doing, for the watchdog's line: its
 * state letter (/proc/PID/stat: running, sleeping, in uninterruptible
 * sleep, stopped) and where it sleeps in the kernel (/proc/PID/wchan). */
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

#endif
