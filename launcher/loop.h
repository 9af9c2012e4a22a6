/* The launcher's event loop: one thread, one poll(), in the manner of redis's
 * ae. It watches a signalfd and the descriptors its pollers hand it, runs
 * timers, and sleeps until the nearest deadline (a timer's, or one a poller
 * reports). The signals it handles are blocked and read from the signalfd,
 * so nothing runs in signal context: handlers are told in the loop.
 *
 * Everything that waits in mglaunch is a poller or a timer here: the
 * workers' pipes and the agent's deadlines, the rendezvous store the agent
 * may host, a rendezvous backend's retries. */
#ifndef MG_LOOP_H
#define MG_LOOP_H

#include <poll.h>
#include <signal.h>
#include <stdint.h>

#define MG_LOOP_MAX_POLLERS 8
#define MG_LOOP_MAX_TIMERS  32

/* A source of descriptors, e.g. the store server (mg_store_server_pollfds /
 * _process / _timeout_ms have these shapes). */
struct mg_poller {
    /* Fills up to max pollfds; returns how many, or -ENOSPC to get more room. */
    int (*fill)(void *ctx, struct pollfd *fds, int max);
    /* Handles the poll results for the fds it filled; called after every
     * poll, also one that timed out (a poller may have timers of its own). */
    int (*process)(void *ctx, const struct pollfd *fds, int n);
    /* Milliseconds until it needs to run without I/O, or -1. Optional. */
    int (*timeout_ms)(void *ctx);
    void *ctx;
};

/* Called once, at its deadline, with the id mg_loop_add_timer returned (the
 * slot is free again by then). */
typedef void (*mg_loop_timer_fn)(void *ctx, int id);

/* What to do with the signals read from the signalfd, in the order they came;
 * SIGCHLDs are folded into one children() call after the others. */
struct mg_loop_signals {
    void (*signal)(void *ctx, int sig);
    void (*children)(void *ctx);
    void *ctx;
};

struct mg_loop {
    int sfd;
    sigset_t oldmask;
    struct mg_loop_signals on;
    struct {
        int used;
        struct mg_poller p;
        int first, n; /* its pollfds in this iteration */
    } pollers[MG_LOOP_MAX_POLLERS];
    struct {
        int used;
        int64_t deadline; /* mg_now_ms() clock */
        mg_loop_timer_fn fn;
        void *ctx;
    } timers[MG_LOOP_MAX_TIMERS];
    struct pollfd *pfd;
    int pfd_cap;
    int poller_room; /* pollfds the pollers needed last time */
};

/* Blocks signals in the calling thread and opens a signalfd for them.
 * Returns 0 or a negative errno (the mask is then left as it was). */
int mg_loop_init(struct mg_loop *l, const sigset_t *signals, const struct mg_loop_signals *on);
/* Closes the signalfd and restores the signal mask. */
void mg_loop_release(struct mg_loop *l);

/* Returns an id (>= 0) for mg_loop_remove_poller, or -ENOSPC. */
int mg_loop_add_poller(struct mg_loop *l, const struct mg_poller *p);
void mg_loop_remove_poller(struct mg_loop *l, int id);
/* Calls fn once at deadline_ms (mg_now_ms() clock). Returns an id, or -ENOSPC. */
int mg_loop_add_timer(struct mg_loop *l, int64_t deadline_ms, mg_loop_timer_fn fn, void *ctx);
void mg_loop_cancel_timer(struct mg_loop *l, int id);

/* One iteration: waits until a descriptor is ready or the nearest deadline,
 * then runs the pollers (in the order they were added), the signal handlers
 * and the timers that are due. Returns 0, or a negative errno with *what
 * naming the step that failed ("poll set", "poll"). */
int mg_loop_once(struct mg_loop *l, const char **what);

#endif
