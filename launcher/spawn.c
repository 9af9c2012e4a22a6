/* vfork + exec of one worker (see spawn.h). */
#include "spawn.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>

/* The child side, between vfork and exec: system calls only. It shares the
 * parent's memory until it execs, so the parent learns of an exec failure
 * through *err as soon as vfork returns. */
static __attribute__((noinline, noreturn)) void spawn_child(const struct mg_spawn_req *req,
                                                            pid_t parent, volatile int *err)
{
    sigset_t none;
    struct sigaction dfl = {.sa_handler = SIG_DFL};
    int e;

    if (req->tty_fd > 0) {
        /* A session of its own, so the terminal can be its controlling one. */
        if (setsid() < 0 || ioctl(req->tty_fd, TIOCSCTTY, 0) < 0) {
            e = errno;
            goto fail;
        }
    } else {
        setpgid(0, 0);
    }
    /* Die with the launcher; if it already died, do not start at all. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    /* Under Yama's ptrace_scope 1 (Ubuntu's default) only an ancestor may
     * attach: let mglaunch and its children (the watchdog's gdb or eu-stack,
     * siblings of this worker) take its stack. EINVAL without Yama. */
    prctl(PR_SET_PTRACER, parent);
    if (getppid() != parent) {
        *err = ESRCH;
        _exit(137);
    }
    if (req->sentinel_fd >= 0) {
        int pgid = (int)getpid();
        ssize_t rc = write(req->sentinel_fd, &pgid, sizeof(pgid));
        (void)rc;
    }
    int in = req->tty_fd > 0 ? req->tty_fd : req->stdin_fd;
    int out = req->tty_fd > 0 ? req->tty_fd : req->stdout_fd;
    if ((in >= 0 && dup2(in, 0) < 0) || (out >= 0 && dup2(out, 1) < 0) ||
        (req->stderr_fd >= 0 && dup2(req->stderr_fd, 2) < 0)) {
        e = errno;
        goto fail;
    }
    /* The fd table is the child's own (vfork copies it), so clearing
     * close-on-exec here leaves mglaunch's descriptors as they are. */
    for (int i = 0; req->keep_fds && i < req->nkeep; i++)
        if (req->keep_fds[i] > 2 && fcntl(req->keep_fds[i], F_SETFD, 0) < 0) {
            e = errno;
            goto fail;
        }
    sigaction(SIGPIPE, &dfl, NULL);
    for (int s = 1; req->reset && s < NSIG; s++)
        if (sigismember(req->reset, s) == 1)
            sigaction(s, &dfl, NULL);
    if (req->numa)
        mg_numa_apply(req->numa);
    if (req->nofile_soft) {
        struct rlimit rl;
        if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur > req->nofile_soft) {
            rl.rlim_cur = req->nofile_soft;
            setrlimit(RLIMIT_NOFILE, &rl);
        }
    }
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    if (!req->path || !*req->path) {
        e = ENOENT;
        goto fail;
    }
    execve(req->path, req->argv, req->envp);
    e = errno;
fail:
    *err = e;
    _exit(e == ENOENT || e == ENOTDIR ? 127 : 126);
}

int mg_spawn(const struct mg_spawn_req *req, struct mg_spawned *out)
{
    volatile int err = 0;
    pid_t parent = getpid();

    /* vfork: no page tables to copy and nothing to copy on write; the parent
     * waits only until the child has exec'd (or failed to). */
    pid_t pid = vfork();
    if (pid < 0)
        return -errno;
    if (pid == 0)
        spawn_child(req, parent, &err);
    /* Also from this side, so the group exists before we ever signal it. */
    setpgid(pid, pid);
    out->pid = pid;
    out->exec_errno = err;
    return 0;
}
