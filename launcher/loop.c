/* The poll loop (see loop.h). */
#include "loop.h"
#include "net.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

int mg_loop_init(struct mg_loop *l, const sigset_t *signals, const struct mg_loop_signals *on)
{
    memset(l, 0, sizeof(*l));
    l->on = *on;
    sigprocmask(SIG_BLOCK, signals, &l->oldmask);
    l->sfd = signalfd(-1, signals, SFD_NONBLOCK | SFD_CLOEXEC);
    if (l->sfd < 0) {
        int rc = -errno;
        sigprocmask(SIG_SETMASK, &l->oldmask, NULL);
        return rc;
    }
    return 0;
}

void mg_loop_release(struct mg_loop *l)
{
    if (l->sfd >= 0) {
        close(l->sfd);
        sigprocmask(SIG_SETMASK, &l->oldmask, NULL);
    }
    l->sfd = -1;
    free(l->pfd);
    l->pfd = NULL;
    l->pfd_cap = 0;
}

int mg_loop_add_poller(struct mg_loop *l, const struct mg_poller *p)
{
    for (int i = 0; i < MG_LOOP_MAX_POLLERS; i++)
        if (!l->pollers[i].used) {
            l->pollers[i].used = 1;
            l->pollers[i].p = *p;
            l->pollers[i].n = 0;
            if (l->poller_room < 64)
                l->poller_room = 64;
            return i;
        }
    return -ENOSPC;
}

void mg_loop_remove_poller(struct mg_loop *l, int id)
{
    if (id >= 0 && id < MG_LOOP_MAX_POLLERS) {
        l->pollers[id].used = 0;
        l->pollers[id].n = 0;
    }
}

int mg_loop_add_timer(struct mg_loop *l, int64_t deadline_ms, mg_loop_timer_fn fn, void *ctx)
{
    for (int i = 0; i < MG_LOOP_MAX_TIMERS; i++)
        if (!l->timers[i].used) {
            l->timers[i].used = 1;
            l->timers[i].deadline = deadline_ms;
            l->timers[i].fn = fn;
            l->timers[i].ctx = ctx;
            return i;
        }
    return -ENOSPC;
}

void mg_loop_cancel_timer(struct mg_loop *l, int id)
{
    if (id >= 0 && id < MG_LOOP_MAX_TIMERS)
        l->timers[id].used = 0;
}

/* The poll timeout: the nearest timer, or sooner if a poller asks. */
static int next_timeout(const struct mg_loop *l)
{
    int64_t dl = -1;
    for (int i = 0; i < MG_LOOP_MAX_TIMERS; i++)
        if (l->timers[i].used && (dl < 0 || l->timers[i].deadline < dl))
            dl = l->timers[i].deadline;
    int t = mg_ms_until(dl);
    for (int i = 0; i < MG_LOOP_MAX_POLLERS; i++)
        if (l->pollers[i].used && l->pollers[i].p.timeout_ms) {
            int pt = l->pollers[i].p.timeout_ms(l->pollers[i].p.ctx);
            if (pt >= 0 && (t < 0 || pt < t))
                t = pt;
        }
    return t;
}

static int ensure_pfd(struct mg_loop *l, int need)
{
    if (need <= l->pfd_cap)
        return 0;
    int cap = l->pfd_cap ? l->pfd_cap : 64;
    while (cap < need)
        cap *= 2;
    struct pollfd *p = realloc(l->pfd, (size_t)cap * sizeof(*p));
    if (!p)
        return -ENOMEM;
    l->pfd = p;
    l->pfd_cap = cap;
    return 0;
}

/* The signalfd first, then each poller's descriptors; returns how many. */
static int build_pollfds(struct mg_loop *l)
{
    int n = 0;
    if (ensure_pfd(l, 1 + l->poller_room))
        return -ENOMEM;
    l->pfd[n].fd = l->sfd;
    l->pfd[n++].events = POLLIN;
    for (int k = 0; k < MG_LOOP_MAX_POLLERS; k++) {
        if (!l->pollers[k].used)
            continue;
        for (;;) {
            int got = l->pollers[k].p.fill(l->pollers[k].p.ctx, l->pfd + n, l->pfd_cap - n);
            if (got == -ENOSPC) {
                if (l->poller_room > (1 << 20) || ensure_pfd(l, l->pfd_cap * 2))
                    return -ENOMEM;
                l->poller_room = l->pfd_cap;
                continue;
            }
            l->pollers[k].first = n;
            l->pollers[k].n = got > 0 ? got : 0;
            n += l->pollers[k].n;
            break;
        }
    }
    return n;
}

static void read_signals(struct mg_loop *l)
{
    struct signalfd_siginfo si[16];
    int chld = 0;
    for (;;) {
        ssize_t r = read(l->sfd, si, sizeof(si));
        if (r <= 0)
            break;
        for (size_t k = 0; k < (size_t)r / sizeof(si[0]); k++) {
            if (si[k].ssi_signo == SIGCHLD)
                chld = 1;
            else
                l->on.signal(l->on.ctx, (int)si[k].ssi_signo);
        }
    }
    if (chld)
        l->on.children(l->on.ctx);
}

int mg_loop_once(struct mg_loop *l, const char **what)
{
    int n = build_pollfds(l);
    if (n < 0) {
        *what = "poll set";
        return n;
    }
    int rc = poll(l->pfd, (nfds_t)n, next_timeout(l));
    if (rc < 0 && errno != EINTR) {
        *what = "poll";
        return -errno;
    }
    if (rc <= 0)
        for (int i = 0; i < n; i++)
            l->pfd[i].revents = 0;
    for (int k = 0; k < MG_LOOP_MAX_POLLERS; k++)
        if (l->pollers[k].used && l->pollers[k].n)
            l->pollers[k].p.process(l->pollers[k].p.ctx, l->pfd + l->pollers[k].first,
                                    l->pollers[k].n);
    if (l->pfd[0].revents)
        read_signals(l);
    int64_t now = mg_now_ms();
    for (int k = 0; k < MG_LOOP_MAX_TIMERS; k++)
        if (l->timers[k].used && now >= l->timers[k].deadline) {
            l->timers[k].used = 0;
            l->timers[k].fn(l->timers[k].ctx, k);
        }
    return 0;
}
