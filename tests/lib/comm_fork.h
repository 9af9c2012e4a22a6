/* Forked ranks of a CPU communicator without the store: a shared memory
 * segment per simulated host and a socketpair per ring link, made before
 * fork and assembled into each rank's communicator the way comm_cpu_boot.c
 * does it. Shared by test_comm.c and test_comm_shift.c. */
#ifndef MG_COMM_FORK_H
#define MG_COMM_FORK_H

#include "tap.h"
#include "comm_internal.h"
#include "mg_err.h"
#include "net.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAXW 8

struct plan {
    const char *name;
    int world;
    int host_of[MAXW];
    int all_ring;
    size_t max_bytes;
    int rank_order;
    int timeout_ms;
    int registered; /* the failure tests use registered memory */
    size_t zc_min;  /* shm zero-copy threshold (0 = default) */
    int rs;         /* the failure tests run reduce-scatters, not allreduces */
};

#define DEFAULT_ZC_FROM ((64u << 10) + 1) /* comm_shm.c: the messages above small_max */

struct wiring {
    int sp[MAXW][2]; /* ring edge i: member i's next (sp[i][0]) to member i+1's prev (sp[i][1]) */
    char shm_name[MAXW][64];
};

static inline int nhosts_of(const struct plan *p)
{
    int nh = 0;
    for (int r = 0; r < p->world; r++)
        if (p->host_of[r] + 1 > nh)
            nh = p->host_of[r] + 1;
    return nh;
}

/* Builds this rank's communicator from the wiring made before fork. */
static inline int build(const struct plan *p, struct wiring *w, int rank, struct mg_comm **out)
{
    int world = p->world, h = p->host_of[rank], nh = nhosts_of(p);
    int local[MAXW], nl = 0, lr = 0, rc;
    struct mg_shm *shm = NULL;
    struct mg_ring *ring = NULL;

    for (int r = 0; r < world; r++)
        if (p->host_of[r] == h) {
            if (r == rank)
                lr = nl;
            local[nl++] = r;
        }
    if (!p->all_ring && nl > 1) {
        struct mg_shm_cfg cfg = {
            .nlocal = nl, .local_rank = lr, .ranks = local, .spin_us = -1, .zc_min = p->zc_min};
        if (lr == 0) {
            rc = mg_shm_create(&shm, w->shm_name[h], 42, &cfg);
        } else {
            int64_t end = mg_now_ms() + 10000;
            while (((rc = mg_shm_attach(&shm, w->shm_name[h], 42, &cfg)) == -ENOENT ||
                    rc == -MG_EFORMAT) &&
                   mg_now_ms() < end)
                usleep(1000);
        }
        if (rc)
            return rc;
        struct mg_fault f;
        rc = mg_shm_wait_attached(shm, mg_now_ms() + 10000, &f);
        if (rc)
            return rc;
        if (lr == 0)
            mg_shm_unlink(w->shm_name[h]);
    }
    /* Ring members: everyone, or the first rank of each host. */
    int members[MAXW], n = 0, idx = -1;
    for (int r = 0; r < world; r++) {
        int first = 1;
        for (int q = 0; q < r; q++)
            if (p->host_of[q] == p->host_of[r])
                first = 0;
        if (p->all_ring || nh == world || (nh > 1 && first)) {
            if (r == rank)
                idx = n;
            members[n++] = r;
        }
    }
    int keep_next = -1, keep_prev = -1;
    if (idx >= 0) {
        keep_next = w->sp[idx][0];
        keep_prev = w->sp[(idx + n - 1) % n][1];
    }
    for (int i = 0; i < MAXW; i++)
        for (int j = 0; j < 2; j++)
            if (w->sp[i][j] >= 0 && w->sp[i][j] != keep_next && w->sp[i][j] != keep_prev)
                close(w->sp[i][j]);
    if (idx >= 0) {
        rc = mg_ring_create(&ring, n, idx, members, keep_next, keep_prev, 0);
        if (rc)
            return rc;
    }
    struct mg_cpu_parts parts = {.rank = rank,
                                 .world = world,
                                 .host_of = p->host_of,
                                 .all_ring = p->all_ring,
                                 .shm = shm,
                                 .ring = ring,
                                 .timeout_ms = p->timeout_ms ? p->timeout_ms : 60000};
    rc = mg_comm_cpu_assemble(out, &parts);
    if (rc)
        return rc;
    return mg_comm_cpu_check(*out, 20000);
}

typedef int (*rank_fn)(const struct plan *p, struct mg_comm *c, int rank);

/* Forks one process per rank; each builds its communicator and runs fn, whose
 * return value becomes its exit status. statuses[] receives the wait statuses. */
static inline void run_job(const struct plan *p, rank_fn fn, int *statuses)
{
    struct wiring w;
    for (int i = 0; i < MAXW; i++) {
        w.sp[i][0] = w.sp[i][1] = -1;
        if (i < p->world && socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, w.sp[i]) < 0)
            BAIL_OUT("socketpair: %s", strerror(errno));
        snprintf(w.shm_name[i], sizeof(w.shm_name[i]), "/mg-test-%d-%d", (int)getpid(), i);
    }
    fflush(stdout);
    pid_t pids[MAXW];
    for (int r = 0; r < p->world; r++) {
        pids[r] = fork();
        if (pids[r] < 0)
            BAIL_OUT("fork: %s", strerror(errno));
        if (pids[r] == 0) {
            alarm(240);
            struct mg_comm *c = NULL;
            int rc = build(p, &w, r, &c);
            if (rc) {
                printf("# %s: rank %d: setup failed: %s %s\n", p->name, r, mg_strerror(rc),
                       c ? mg_comm_errmsg(c) : "");
                fflush(stdout);
                _exit(100);
            }
            int status = fn(p, c, r);
            mg_comm_release(c);
            fflush(stdout);
            _exit(status);
        }
    }
    for (int i = 0; i < MAXW; i++)
        for (int j = 0; j < 2; j++)
            if (w.sp[i][j] >= 0)
                close(w.sp[i][j]);
    for (int r = 0; r < p->world; r++)
        while (waitpid(pids[r], &statuses[r], 0) < 0 && errno == EINTR)
            ;
    for (int i = 0; i < MAXW; i++)
        mg_shm_unlink(w.shm_name[i]); /* in case a leader died before unlinking */
}

#endif
