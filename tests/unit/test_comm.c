/* The CPU collectives without the store: ranks are forked processes joined by
 * a shared memory segment and socketpairs, assembled into a communicator the
 * way comm_boot.c does it. Covers every layout (shared memory, TCP ring,
 * hierarchical, hosts with non-contiguous ranks), world sizes 1 to 4, sizes
 * up to 64 MB, and the failures: a rank killed mid-collective, a hung rank,
 * a rank calling a different collective.
 * timeout: 300 */
#include "../tap.h"
#include "../comm_check.h"
#include "comm_internal.h"
#include "mg_err.h"
#include "net.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
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
};

struct wiring {
    int sp[MAXW][2]; /* ring edge i: member i's next (sp[i][0]) to member i+1's prev (sp[i][1]) */
    char shm_name[MAXW][64];
};

static int nhosts_of(const struct plan *p)
{
    int nh = 0;
    for (int r = 0; r < p->world; r++)
        if (p->host_of[r] + 1 > nh)
            nh = p->host_of[r] + 1;
    return nh;
}

/* Builds this rank's communicator from the wiring made before fork. */
static int build(const struct plan *p, struct wiring *w, int rank, struct mg_comm **out)
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
        struct mg_shm_cfg cfg = {.nlocal = nl, .local_rank = lr, .ranks = local, .spin_us = -1};
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
static void run_job(const struct plan *p, rank_fn fn, int *statuses)
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

static int fn_checks(const struct plan *p, struct mg_comm *c, int rank)
{
    struct cc_opts o = {.max_bytes = p->max_bytes, .rank_order = p->rank_order};
    int bad = cc_run_all(c, &o);
    return bad > 99 ? 99 : bad;
}

static void check_layout(const struct plan *p)
{
    int st[MAXW];
    run_job(p, fn_checks, st);
    for (int r = 0; r < p->world; r++)
        ok(WIFEXITED(st[r]) && WEXITSTATUS(st[r]) == 0, "%s: rank %d: all collectives correct",
           p->name, r);
}

/* ---- failures ------------------------------------------------------------------- */

static const int victim = 2;

static void *killer(void *arg)
{
    usleep(30000);
    raise(SIGKILL);
    return NULL;
}

/* Everyone loops over 16 MB allreduces; the victim is SIGKILLed 30 ms in. The
 * others must fail (not hang), naming the victim where they wait for it. Exit
 * status: 0 = named the victim, 1 = failed naming someone else, 2 = no failure. */
static int fn_killed(const struct plan *p, struct mg_comm *c, int rank)
{
    size_t n = 4u << 20;
    float *buf = calloc(n, sizeof(float));
    pthread_t t;
    if (rank == victim)
        pthread_create(&t, NULL, killer, NULL);
    for (int i = 0; i < 100000; i++) {
        int rc = mg_comm_allreduce(c, buf, n, MG_REDUCE_SUM, MG_COMM_DEFAULT_TIMEOUT);
        if (rc) {
            char want[32];
            snprintf(want, sizeof(want), "rank %d", victim);
            printf("# %s: rank %d: %s\n", p->name, rank, mg_comm_errmsg(c));
            int again = mg_comm_allreduce(c, buf, 1, MG_REDUCE_SUM, MG_COMM_DEFAULT_TIMEOUT);
            if (again != rc)
                return 3; /* a broken communicator must keep failing the same way */
            return strstr(mg_comm_errmsg(c), want) && rc == -MG_EPEER ? 0 : 1;
        }
    }
    return 2;
}

/* The victim hangs (sleeps) instead of calling; the others time out naming it. */
static int fn_hung(const struct plan *p, struct mg_comm *c, int rank)
{
    float x[16] = {0};
    if (rank == victim) {
        sleep(1);
        return 0;
    }
    int rc = mg_comm_allreduce(c, x, 16, MG_REDUCE_SUM, 300);
    printf("# %s: rank %d: %s\n", p->name, rank, mg_comm_errmsg(c));
    if (rc != -ETIMEDOUT && !(rc == -MG_EPEER && p->all_ring))
        return 1;
    char want[64];
    snprintf(want, sizeof(want), "waiting for rank %d", victim);
    return strstr(mg_comm_errmsg(c), want) ? 0 : 1;
}

/* Rank 1 calls allreduce with one float more than the others. */
static int fn_mismatch(const struct plan *p, struct mg_comm *c, int rank)
{
    float x[17] = {0};
    int rc = mg_comm_allreduce(c, x, rank == 1 ? 17 : 16, MG_REDUCE_SUM, 5000);
    printf("# %s: rank %d: %s\n", p->name, rank, mg_comm_errmsg(c));
    return rc ? 0 : 1;
}

int main(void)
{
    /* World size 1: a no-op communicator with the same contract. */
    struct mg_comm *one;
    is_int(mg_comm_single_create(&one), 0, "single communicator");
    float x[3] = {1, 2, 3};
    unsigned char g[4] = {0};
    is_int(mg_comm_allreduce(one, x, 3, MG_REDUCE_AVG, MG_COMM_DEFAULT_TIMEOUT), 0,
           "world 1: allreduce");
    ok(x[0] == 1 && x[1] == 2 && x[2] == 3, "world 1: avg of one value is itself");
    is_int(mg_comm_allgather(one, "abcd", g, 4, MG_COMM_DEFAULT_TIMEOUT), 0, "world 1: allgather");
    ok(memcmp(g, "abcd", 4) == 0, "world 1: allgather copies");
    is_int(mg_comm_broadcast(one, g, 4, 1, MG_COMM_DEFAULT_TIMEOUT), -EINVAL,
           "world 1: bad root rejected");
    is_int(mg_comm_barrier(one, MG_COMM_DEFAULT_TIMEOUT), 0, "world 1: barrier");
    mg_comm_release(one);

    /* The chunking used by both paths. */
    size_t off[5];
    mg_split_chunks(100, 4, off);
    ok(off[0] == 0 && off[4] == 100 && off[1] % 16 == 0 && off[2] % 16 == 0 && off[3] % 16 == 0,
       "chunks of 100 floats over 4 ranks start on 64-byte boundaries");
    mg_split_chunks(1, 3, off);
    ok(off[0] == 0 && off[3] == 1, "one float over 3 ranks");

    struct plan layouts[] = {
        {"shm w2", 2, {0, 0}, 0, 64u << 20, 1},
        {"shm w3", 3, {0, 0, 0}, 0, 4u << 20, 1},
        {"shm w4", 4, {0, 0, 0, 0}, 0, 4u << 20, 1},
        {"ring w2", 2, {0, 0}, 1, 16u << 20, 0},
        {"ring w3", 3, {0, 0, 0}, 1, 4u << 20, 0},
        {"ring w4 (one rank per host)", 4, {0, 1, 2, 3}, 0, 1u << 20, 0},
        {"hier 2x2", 4, {0, 0, 1, 1}, 0, 4u << 20, 0},
        {"hier 2+1", 3, {0, 0, 1}, 0, 1u << 20, 0},
        {"hier interleaved", 4, {0, 1, 0, 1}, 0, 1u << 20, 0},
    };
    for (size_t i = 0; i < sizeof(layouts) / sizeof(layouts[0]); i++)
        check_layout(&layouts[i]);

    /* Failures. */
    struct plan killed[] = {
        {"killed shm w3", 3, {0, 0, 0}, 0, 0, 0, 20000},
        {"killed ring w3", 3, {0, 0, 0}, 1, 0, 0, 20000},
        {"killed hier 2x2", 4, {0, 0, 1, 1}, 0, 0, 0, 20000},
    };
    for (size_t i = 0; i < sizeof(killed) / sizeof(killed[0]); i++) {
        int st[MAXW];
        int64_t t0 = mg_now_ms();
        run_job(&killed[i], fn_killed, st);
        int64_t took = mg_now_ms() - t0;
        ok(WIFSIGNALED(st[victim]) && WTERMSIG(st[victim]) == SIGKILL, "%s: victim killed",
           killed[i].name);
        int naming = 0;
        for (int r = 0; r < killed[i].world; r++) {
            if (r == victim)
                continue;
            /* In a ring the victim's neighbours race: one sees it go, the
             * other may first see that neighbour give up and name it instead.
             * Everyone must fail, none may hang, and someone names the victim. */
            int adjacent = !killed[i].all_ring;
            if (!strcmp(killed[i].name, "killed hier 2x2"))
                adjacent = r == 3; /* shares the victim's host */
            naming += WIFEXITED(st[r]) && WEXITSTATUS(st[r]) == 0;
            if (adjacent)
                ok(WIFEXITED(st[r]) && WEXITSTATUS(st[r]) == 0,
                   "%s: rank %d fails with -MG_EPEER naming rank %d", killed[i].name, r, victim);
            else
                ok(WIFEXITED(st[r]) && WEXITSTATUS(st[r]) <= 1, "%s: rank %d fails too",
                   killed[i].name, r);
        }
        ok(naming >= 1, "%s: at least one rank names rank %d", killed[i].name, victim);
        diag("%s: all ranks done in %lld ms (collective timeout 20 s)", killed[i].name,
             (long long)took);
    }
    struct plan hung[] = {
        {"hung shm w3", 3, {0, 0, 0}, 0, 0, 0, 20000},
        {"hung hier 2x2", 4, {0, 0, 1, 1}, 0, 0, 0, 20000},
    };
    for (size_t i = 0; i < sizeof(hung) / sizeof(hung[0]); i++) {
        int st[MAXW];
        run_job(&hung[i], fn_hung, st);
        for (int r = 0; r < hung[i].world; r++) {
            if (r == victim)
                continue;
            int names = !strstr(hung[i].name, "hier") || r == 3;
            if (names)
                ok(WIFEXITED(st[r]) && WEXITSTATUS(st[r]) == 0,
                   "%s: rank %d times out naming rank %d", hung[i].name, r, victim);
            else
                ok(WIFEXITED(st[r]), "%s: rank %d fails (its neighbour gave up)", hung[i].name, r);
        }
    }
    struct plan mism[] = {
        {"mismatch shm w2", 2, {0, 0}, 0, 0, 0, 5000},
        {"mismatch ring w2", 2, {0, 0}, 1, 0, 0, 5000},
    };
    for (size_t i = 0; i < sizeof(mism) / sizeof(mism[0]); i++) {
        int st[MAXW];
        run_job(&mism[i], fn_mismatch, st);
        for (int r = 0; r < 2; r++)
            ok(WIFEXITED(st[r]) && WEXITSTATUS(st[r]) == 0, "%s: rank %d detects it", mism[i].name,
               r);
    }
    return done_testing();
}
