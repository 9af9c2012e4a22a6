/* The CPU collectives without the store: ranks are forked processes joined by
 * a shared memory segment and socketpairs, assembled into a communicator the
 * way comm_cpu_boot.c does it. Covers every layout (shared memory, TCP ring,
 * hierarchical, hosts with non-contiguous ranks), world sizes 1 to 4, sizes
 * up to 64 MB, and the failures: a rank killed mid-collective, a hung rank,
 * a rank calling a different collective; reduce-scatter the same way. The
 * same for allreduces and reduce-scatters in
 * registered memory (zero-copy on one host), and its fallbacks: buffers that
 * are not registered on every rank or not at the same offset, the layouts
 * without shared memory, registrations past the limit.
 * timeout: 300 */
#include "tap.h"
#include "comm_check.h"
#include "comm_fork.h"
#include "comm_internal.h"
#include "mg_err.h"
#include "net.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

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

/* ---- registered memory ---------------------------------------------------------- */

static int fn_registered(const struct plan *p, struct mg_comm *c, int rank)
{
    struct cc_opts o = {.max_bytes = p->max_bytes, .rank_order = p->rank_order};
    int bad = cc_run_registered(c, &o, p->zc_min ? p->zc_min : DEFAULT_ZC_FROM);
    return bad > 99 ? 99 : bad;
}

static void check_registered(const struct plan *p)
{
    int st[MAXW];
    run_job(p, fn_registered, st);
    for (int r = 0; r < p->world; r++)
        ok(WIFEXITED(st[r]) && WEXITSTATUS(st[r]) == 0,
           "%s: rank %d: allreduces in registered memory correct, same bits as ordinary memory",
           p->name, r);
}

/* Registered buffers that the ranks do not hold alike: the staging path, the
 * same results. Exit status: 0, or 1 + the case that went wrong. */
static int fn_fallback(const struct plan *p, struct mg_comm *c, int rank)
{
    size_t n = 300000;
    struct cc_opts o = {.max_bytes = 4 * n, .rank_order = 1};
    void *mem, *more[MG_SHM_MAX_REGS + 1];
    float *plain = malloc(n * sizeof(float)), *ref = malloc(n * sizeof(float));
    if (!plain || !ref || mg_comm_mem_alloc(c, (n + 64) * sizeof(float), &mem, 5000))
        return 10;
    float *reg = mem;
    uint64_t zc0 = c->zerocopy;
    /* Rank 0's buffer is registered, the others' are not. */
    if (cc_allreduce_in(c, rank == 0 ? reg : plain, n, MG_REDUCE_AVG, 1, &o))
        return 2;
    memcpy(ref, rank == 0 ? reg : plain, n * sizeof(float));
    /* Everyone's is, but rank 1's is one float further in. */
    float *buf = reg + (rank == 1 ? 1 : 0);
    if (cc_allreduce_in(c, buf, n, MG_REDUCE_AVG, 1, &o) || memcmp(buf, ref, n * sizeof(float)))
        return 3;
    if (c->zerocopy != zc0)
        return 4;
    /* Aligned again: zero-copy, the same bits. */
    if (cc_allreduce_in(c, reg + 5, n, MG_REDUCE_AVG, 1, &o) ||
        memcmp(reg + 5, ref, n * sizeof(float)) || c->zerocopy != zc0 + 1)
        return 5;
    /* Past the registration limit: ordinary memory, which works the same. */
    for (int i = 0; i <= MG_SHM_MAX_REGS; i++)
        if (mg_comm_mem_alloc(c, 4 * n, &more[i], 5000))
            return 6;
    float *last = more[MG_SHM_MAX_REGS];
    if (cc_allreduce_in(c, last, n, MG_REDUCE_AVG, 1, &o) || memcmp(last, ref, n * sizeof(float)))
        return 7;
    if (c->zerocopy != zc0 + 1)
        return 8; /* the last one is not registered */
    for (int i = 0; i <= MG_SHM_MAX_REGS; i++)
        mg_comm_mem_free(c, more[i]);
    mg_comm_mem_free(c, reg);
    free(plain);
    free(ref);
    return 0;
}

/* Rank 1 registers another size: both learn it, named. */
static int fn_reg_mismatch(const struct plan *p, struct mg_comm *c, int rank)
{
    void *mem;
    int rc = mg_comm_mem_alloc(c, rank == 1 ? 8192 : 4096, &mem, 5000);
    printf("# %s: rank %d: %s\n", p->name, rank, mg_comm_errmsg(c));
    if (rc != -MG_EPROTO)
        return 1;
    return strstr(mg_comm_errmsg(c), rank == 1 ? "rank 0 called registration of 4096 bytes"
                                               : "rank 1 called registration of 8192 bytes")
               ? 0
               : 2;
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
    float *buf = NULL;
    pthread_t t;
    if (p->registered) {
        void *mem;
        if (mg_comm_mem_alloc(c, n * sizeof(float), &mem, MG_COMM_DEFAULT_TIMEOUT))
            return 4;
        buf = mem;
    } else {
        buf = calloc(n, sizeof(float));
    }
    if (rank == victim)
        pthread_create(&t, NULL, killer, NULL);
    for (int i = 0; i < 100000; i++) {
        int rc = p->rs ? mg_comm_reduce_scatter(c, buf, buf + (size_t)rank * (n / 4), n / 4,
                                                MG_REDUCE_AVG, MG_COMM_DEFAULT_TIMEOUT)
                       : mg_comm_allreduce(c, buf, n, MG_REDUCE_SUM, MG_COMM_DEFAULT_TIMEOUT);
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
    float x[16] = {0}, *buf = x;
    size_t n = 16;
    if (p->registered) {
        void *mem;
        n = 1u << 18; /* 1 MB: zero-copy */
        if (mg_comm_mem_alloc(c, n * sizeof(float), &mem, MG_COMM_DEFAULT_TIMEOUT))
            return 4;
        buf = mem;
    }
    if (rank == victim) {
        sleep(1);
        return 0;
    }
    int rc = mg_comm_allreduce(c, buf, n, MG_REDUCE_SUM, 300);
    printf("# %s: rank %d: %s\n", p->name, rank, mg_comm_errmsg(c));
    if (rc != -ETIMEDOUT && !(rc == -MG_EPEER && p->all_ring))
        return 1;
    char want[64];
    snprintf(want, sizeof(want), "waiting for rank %d", victim);
    return strstr(mg_comm_errmsg(c), want) ? 0 : 1;
}

/* Rank 1 calls allreduce with one float more than the others (with rs: a
 * reduce-scatter of the same floats instead). */
static int fn_mismatch(const struct plan *p, struct mg_comm *c, int rank)
{
    float x[17] = {0};
    int rc = p->rs && rank == 1 ? mg_comm_reduce_scatter(c, x, x + 8, 8, MG_REDUCE_AVG, 5000)
                                : mg_comm_allreduce(c, x, rank == 1 || p->rs ? 16 + !p->rs : 16,
                                                    MG_REDUCE_SUM, 5000);
    printf("# %s: rank %d: %s\n", p->name, rank, mg_comm_errmsg(c));
    if (p->rs && rank == 0 &&
        !strstr(mg_comm_errmsg(c), "rank 1 called reduce-scatter (avg) of 8 "
                                   "floats per rank instead"))
        return 2;
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
    void *mem = NULL;
    is_int(mg_comm_mem_alloc(one, 0, &mem, MG_COMM_DEFAULT_TIMEOUT), -EINVAL,
           "world 1: registering 0 bytes is refused");
    is_int(mg_comm_mem_alloc(one, 10000, &mem, MG_COMM_DEFAULT_TIMEOUT), 0,
           "world 1: registered memory");
    ok(mem && (uintptr_t)mem % 4096 == 0 && ((char *)mem)[9999] == 0,
       "world 1: registered memory is page-aligned and zero-filled");
    struct cc_opts o1 = {.max_bytes = 4u << 20, .rank_order = 1};
    is_int(cc_run_registered(one, &o1, SIZE_MAX), 0, "world 1: allreduces in registered memory");
    mg_comm_mem_free(one, mem);
    mg_comm_release(one);

    /* MG_COMM_ZEROCOPY */
    struct mg_comm_opts co = {0};
    char err[256] = "";
    setenv("MG_COMM_ZEROCOPY", "0", 1);
    is_int(mg_comm_opts_from_env(&co, err, sizeof(err)), 0, "MG_COMM_ZEROCOPY=0 accepted");
    ok(co.no_zerocopy == 1, "MG_COMM_ZEROCOPY=0 turns registration off");
    setenv("MG_COMM_ZEROCOPY", "yes", 1);
    is_int(mg_comm_opts_from_env(&co, err, sizeof(err)), -EINVAL, "MG_COMM_ZEROCOPY=yes refused");
    ok(strstr(err, "MG_COMM_ZEROCOPY='yes': expected 0 or 1") != NULL,
       "the message names the variable");
    unsetenv("MG_COMM_ZEROCOPY");

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

    /* Registered memory: zero-copy on one host (above 64 KiB by default, every
     * size with zc_min 1), ordinary memory in the other layouts. */
    struct plan reg_layouts[] = {
        {"registered shm w2", 2, {0, 0}, 0, 64u << 20, 1},
        {"registered shm w3 (zero-copy from 1 float)", 3, {0, 0, 0}, 0, 4u << 20, 1, 0, 0, 1},
        {"registered shm w4", 4, {0, 0, 0, 0}, 0, 4u << 20, 1},
        {"registered shm w2 (zero-copy from 1 float)", 2, {0, 0}, 0, 1u << 20, 1, 0, 0, 1},
        {"registered ring w2", 2, {0, 0}, 1, 1u << 20, 0},
        {"registered hier 2x2", 4, {0, 0, 1, 1}, 0, 1u << 20, 0},
    };
    for (size_t i = 0; i < sizeof(reg_layouts) / sizeof(reg_layouts[0]); i++)
        check_registered(&reg_layouts[i]);
    {
        struct plan fb = {"fallback shm w3", 3, {0, 0, 0}, 0, 0, 1, 20000};
        int st[MAXW];
        run_job(&fb, fn_fallback, st);
        for (int r = 0; r < fb.world; r++)
            ok(WIFEXITED(st[r]) && WEXITSTATUS(st[r]) == 0,
               "%s: rank %d: buffers not registered alike take the staging path, same bits "
               "(status %d)",
               fb.name, r, WIFEXITED(st[r]) ? WEXITSTATUS(st[r]) : -1);
        struct plan rm = {"registration mismatch shm w2", 2, {0, 0}, 0, 0, 1, 5000};
        run_job(&rm, fn_reg_mismatch, st);
        for (int r = 0; r < rm.world; r++)
            ok(WIFEXITED(st[r]) && WEXITSTATUS(st[r]) == 0, "%s: rank %d names the other", rm.name,
               r);
    }

    /* Failures. */
    struct plan killed[] = {
        {"killed shm w3", 3, {0, 0, 0}, 0, 0, 0, 20000},
        {"killed zero-copy shm w3", 3, {0, 0, 0}, 0, 0, 0, 20000, 1},
        {"killed zero-copy shm w4", 4, {0, 0, 0, 0}, 0, 0, 0, 20000, 1},
        {"killed ring w3", 3, {0, 0, 0}, 1, 0, 0, 20000},
        {"killed hier 2x2", 4, {0, 0, 1, 1}, 0, 0, 0, 20000},
        {"killed reduce-scatter shm w3", 3, {0, 0, 0}, 0, 0, 0, 20000, .rs = 1},
        {"killed zero-copy reduce-scatter shm w4", 4, {0, 0, 0, 0}, 0, 0, 0, 20000, 1, .rs = 1},
        {"killed reduce-scatter ring w4", 4, {0, 0, 0, 0}, 1, 0, 0, 20000, .rs = 1},
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
        {"hung zero-copy shm w3", 3, {0, 0, 0}, 0, 0, 0, 20000, 1},
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
        {"mismatch reduce-scatter shm w2", 2, {0, 0}, 0, 0, 0, 5000, .rs = 1},
        {"mismatch reduce-scatter ring w2", 2, {0, 0}, 1, 0, 0, 5000, .rs = 1},
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
