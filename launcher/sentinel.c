/* The sentinel process that kills orphaned worker groups (see sentinel.h). */
#include "sentinel.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

static void close_from(int lowfd)
{
#ifdef SYS_close_range
    if (syscall(SYS_close_range, (unsigned)lowfd, ~0u, 0) == 0)
        return;
#endif
    long max = sysconf(_SC_OPEN_MAX);
    if (max < 0 || max > 65536)
        max = 65536;
    for (int fd = lowfd; fd < max; fd++)
        close(fd);
}

static __attribute__((noreturn)) void sentinel_main(int rfd)
{
    static const int ignored[] = {SIGINT,  SIGTERM, SIGHUP,  SIGQUIT, SIGUSR1,
                                  SIGUSR2, SIGPIPE, SIGTSTP, SIGTTIN, SIGTTOU};
    struct sigaction ign = {.sa_handler = SIG_IGN};
    sigset_t none;
    pid_t *groups = NULL;
    size_t n = 0, cap = 0;
    unsigned char buf[4096 + sizeof(int)];
    size_t have = 0;

    setsid();
    prctl(PR_SET_NAME, "mglaunch-sentinel");
    for (size_t i = 0; i < sizeof(ignored) / sizeof(ignored[0]); i++)
        sigaction(ignored[i], &ign, NULL);
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    /* Hold nothing but the pipe: not the launcher's stdout, not its sockets. */
    if (rfd != 3) {
        dup2(rfd, 3);
        close(rfd);
    }
    fcntl(3, F_SETFL, 0); /* blocking reads */
    int null = open("/dev/null", O_RDWR);
    if (null >= 0) {
        dup2(null, 0);
        dup2(null, 1);
        dup2(null, 2);
    }
    close_from(4);

    for (;;) {
        ssize_t r = read(3, buf + have, sizeof(buf) - have);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break; /* EOF: the launcher is gone */
        have += (size_t)r;
        size_t off = 0;
        for (; have - off >= sizeof(int); off += sizeof(int)) {
            int v;
            memcpy(&v, buf + off, sizeof(v));
            if (v > 0) {
                if (n == cap && cap < MG_SENTINEL_MAX_GROUPS) {
                    size_t ncap = cap ? cap * 2 : 64;
                    pid_t *g = realloc(groups, ncap * sizeof(*g));
                    if (g) {
                        groups = g;
                        cap = ncap;
                    }
                }
                if (n < cap)
                    groups[n++] = v;
            } else if (v < 0) {
                for (size_t i = 0; i < n; i++)
                    if (groups[i] == -v) {
                        groups[i] = groups[--n];
                        break;
                    }
            }
        }
        memmove(buf, buf + off, have - off);
        have -= off;
    }
    for (size_t i = 0; i < n; i++)
        kill(-groups[i], SIGKILL);
    _exit(0);
}

int mg_sentinel_start(struct mg_sentinel *s)
{
    int p[2];
    s->pid = -1;
    s->fd = -1;
    if (pipe2(p, O_CLOEXEC) < 0)
        return -errno;
    pid_t pid = fork();
    if (pid < 0) {
        int err = -errno;
        close(p[0]);
        close(p[1]);
        return err;
    }
    if (pid == 0) {
        close(p[1]);
        sentinel_main(p[0]);
    }
    close(p[0]);
    fcntl(p[1], F_SETFL, O_NONBLOCK);
    s->pid = pid;
    s->fd = p[1];
    return 0;
}

static int send_rec(struct mg_sentinel *s, int v)
{
    if (s->fd < 0)
        return -EBADF;
    for (;;) {
        ssize_t r = write(s->fd, &v, sizeof(v));
        if (r == (ssize_t)sizeof(v))
            return 0;
        if (r < 0 && errno == EINTR)
            continue;
        return r < 0 ? -errno : -EIO;
    }
}

int mg_sentinel_add(struct mg_sentinel *s, pid_t pgid)
{
    return send_rec(s, (int)pgid);
}

int mg_sentinel_forget(struct mg_sentinel *s, pid_t pgid)
{
    return send_rec(s, -(int)pgid);
}

void mg_sentinel_stop(struct mg_sentinel *s)
{
    if (s->fd >= 0)
        close(s->fd);
    s->fd = -1;
}
