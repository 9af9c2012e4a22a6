/* Spawning one worker: vfork and exec, in its own process group, killed when
 * the launcher dies, with an exec failure reported back to the launcher and
 * mapped like a shell's (127 for a missing program, 126 when it cannot be
 * executed). */
#ifndef MG_SPAWN_H
#define MG_SPAWN_H

#include "numa.h"

#include <signal.h>
#include <sys/types.h>

struct mg_spawn_req {
    const char *path; /* execve path */
    char *const *argv;
    char *const *envp;
    int stdin_fd;  /* dup'ed onto 0, or -1 to inherit */
    int stdout_fd; /* pipe write ends dup'ed onto 1 and 2 */
    int stderr_fd;
    int sentinel_fd; /* -1, or where the child announces its process group */
    /* > 0: a pseudo-terminal's slave: the child starts a session with it
     * as its controlling terminal (its pid is still its process group), and
     * it becomes stdin and stdout (stdin_fd and stdout_fd unused). 0 or -1:
     * none (so a request that does not mention it has none). */
    int tty_fd;
    /* Signals the child gets with their default action, whatever mglaunch
     * inherited (a handled signal that was ignored at start must not stay
     * ignored in the worker it is passed on to). NULL: none. */
    const sigset_t *reset;
    const struct mg_numa_place *numa; /* --numa-binding, or NULL */
    /* Descriptors (close-on-exec in mglaunch, numbers above 2) the child
     * keeps across exec under the same numbers: the memory the agent lends
     * this worker (rankmem.h). NULL or nkeep 0: none. */
    const int *keep_fds;
    int nkeep;
    /* > 0: the soft open-file limit the child gets back (mglaunch raised
     * its own for the store it hosts: mg_nofile_given); 0: inherited. */
    unsigned long nofile_soft;
};

struct mg_spawned {
    pid_t pid;      /* also the worker's process group id */
    int exec_errno; /* the exec failed with this errno: the child exits 127/126 */
};

/* vforks and execs. In the child: own process group (own session with
 * tty_fd), PR_SET_PDEATHSIG
 * SIGKILL, signal mask, SIGPIPE and the reset signals restored, CPU
 * affinity and memory node set (numa), the soft open-file limit given back
 * (nofile_soft), group announced to the sentinel,
 * stdio set up, keep_fds made inheritable, execve. When exec fails, the child stores the errno
 * in the parent's memory (vfork shares it until exec) and exits 127 (not
 * found) or 126 (cannot execute); mg_spawn returns with exec_errno set. */
int mg_spawn(const struct mg_spawn_req *req, struct mg_spawned *out);

#endif
