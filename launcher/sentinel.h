/* The sentinel: a tiny process forked at start that kills the workers'
 * process groups when the launcher dies without cleaning up (SIGKILL, OOM
 * killer). PR_SET_PDEATHSIG only covers the workers themselves; their
 * children (data loaders, shells, helpers) would survive without this.
 *
 * It holds the read end of a pipe whose only writer is the launcher. Each
 * worker writes its own process group id there before exec (so no group is
 * ever unknown to the sentinel, even if the launcher dies during the fork),
 * and the launcher writes the negated id once the group is gone. On EOF,
 * which happens exactly when the launcher has exited, the sentinel sends
 * SIGKILL to every group still listed and exits. It runs in its own session,
 * so signals aimed at the launcher's process group or terminal miss it. */
#ifndef MG_SENTINEL_H
#define MG_SENTINEL_H

#include <sys/types.h>

#define MG_SENTINEL_MAX_GROUPS 65536

struct mg_sentinel {
    pid_t pid; /* -1 when not running */
    int fd;    /* write end (close-on-exec, non-blocking) */
};

/* Forks the sentinel. Call before opening descriptors it should not hold. */
int mg_sentinel_start(struct mg_sentinel *s);
/* Announces a group (normally the worker does this itself; used when a
 * replacement sentinel is started and needs the live groups). */
int mg_sentinel_add(struct mg_sentinel *s, pid_t pgid);
/* The group is gone: the sentinel must not signal that id any more. */
int mg_sentinel_forget(struct mg_sentinel *s, pid_t pgid);
/* Closes the pipe (the sentinel exits after killing what is still listed). */
void mg_sentinel_stop(struct mg_sentinel *s);

#endif
