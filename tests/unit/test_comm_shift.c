/* The CPU communicator's shift (mg_comm_shift): every rank's block lands,
 * bit for bit, in rank (rank + k) mod world, in every layout (shared memory,
 * TCP ring, hierarchical with equal and unequal hosts, hosts with
 * non-contiguous ranks, a ring over several ranks per host), for several k
 * (k = LOCAL_WORLD_SIZE among them: ZeRO-1's copies on the next node, and
 * negative k) and sizes (empty, in the flag round, pipelined over many
 * steps). Then the failures: a rank SIGKILLed in the middle of shifts (the
 * others fail, naming the shift, none hangs), a rank calling another k or
 * size (named), arguments refused.
 * timeout: 300 */
#include "tap.h"
#include "comm_fork.h"
#include "comm_internal.h"
#include "mg_err.h"
#include "net.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* The k each job shifts by, set before run_job forks. */
static int ks[8], nks;

static const size_t sizes[] = {0, 1, 13, 4096, 65536, 65537, (1u << 20) + 7, 3u << 20};

static unsigned char pattern(int rank, int k, size_t len, size_t i)
{
    return (unsigned char)(rank * 131 + k * 17 + len * 3 + i * 7 + (i >> 9));
}

/* Exit status: the number of (k, size) pairs whose block was wrong (0: all
 * bit-exact), 200 + a failed call. */
static int fn_shift(const struct plan *p, struct mg_comm *c, int rank)
{
    size_t max = sizes[sizeof(sizes) / sizeof(sizes[0]) - 1];
    unsigned char *send = malloc(max + 1), *recv = malloc(max + 1);
    int bad = 0, world = p->world;
    if (!send || !recv)
        return 201;
    for (int j = 0; j < nks; j++)
        for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
            int k = ks[j];
            size_t len = sizes[s];
            for (size_t i = 0; i < len; i++)
                send[i] = pattern(rank, k, len, i);
            memset(recv, 0xa5, max + 1);
            int rc = mg_comm_shift(c, send, recv, len, k, MG_COMM_DEFAULT_TIMEOUT);
            if (rc) {
                printf("# %s: rank %d: shift by %d of %zu bytes: %s (%s)\n", p->name, rank, k, len,
                       mg_strerror(rc), mg_comm_errmsg(c));
                return 200;
            }
            int src = (((rank - k) % world) + world) % world, wrong = 0;
            for (size_t i = 0; i < len && !wrong; i++)
                wrong = recv[i] != pattern(src, k, len, i);
            wrong |= recv[len] != 0xa5; /* nothing written past the block */
            if (wrong)
                printf("# %s: rank %d: shift by %d of %zu bytes: not rank %d's block\n", p->name,
                       rank, k, len, src);
            bad += wrong;
        }
    free(send);
    free(recv);
    return bad;
}

static void check_shift(const struct plan *p, const int *k, int n)
{
    int st[MAXW];
    char list[64] = "";
    nks = n;
    for (int i = 0; i < n; i++) {
        ks[i] = k[i];
        snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s%d", i ? ", " : "", k[i]);
    }
    run_job(p, fn_shift, st);
    for (int r = 0; r < p->world; r++)
        ok(WIFEXITED(st[r]) && WEXITSTATUS(st[r]) == 0,
           "%s: rank %d receives rank (r - k)'s block bit for bit, k = %s, %zu sizes (status %d)",
           p->name, r, list, sizeof(sizes) / sizeof(sizes[0]),
           WIFEXITED(st[r]) ? WEXITSTATUS(st[r]) : -WTERMSIG(st[r]));
}

static const int victim = 2;

static void *killer(void *arg)
{
    usleep(30000);
    raise(SIGKILL);
    return NULL;
}

/* Everyone shifts 4 MB blocks by ks[0] in a loop; the victim is SIGKILLed 30
 * ms in. Exit status: 0 failed naming the victim, 1 failed naming another
 * rank (a neighbour that gave up first), 2 no failure, 3 a broken
 * communicator that did not keep failing, 4 a message without the shift. */
static int fn_killed(const struct plan *p, struct mg_comm *c, int rank)
{
    size_t len = 4u << 20;
    unsigned char *send = calloc(len, 1), *recv = calloc(len, 1);
    pthread_t t;
    if (!send || !recv)
        return 5;
    if (rank == victim)
        pthread_create(&t, NULL, killer, NULL);
    for (int i = 0; i < 100000; i++) {
        int rc = mg_comm_shift(c, send, recv, len, ks[0], MG_COMM_DEFAULT_TIMEOUT);
        if (!rc)
            continue;
        char want[32];
        snprintf(want, sizeof(want), "rank %d", victim);
        printf("# %s: rank %d: %s\n", p->name, rank, mg_comm_errmsg(c));
        if (mg_comm_shift(c, send, recv, len, ks[0], MG_COMM_DEFAULT_TIMEOUT) != rc)
            return 3;
        if (!strstr(mg_comm_errmsg(c), "shift of 4194304 bytes per rank by"))
            return 4;
        return strstr(mg_comm_errmsg(c), want) && rc == -MG_EPEER ? 0 : 1;
    }
    return 2;
}

/* Rank 1 shifts by another k (mode 0) or another size (mode 1). Exit
 * status: 0 failed naming rank 1's call, 1 failed otherwise (a neighbour
 * gave up first), 2 no failure, not even at the next shift. */
static int mism_mode;

static int fn_mismatch(const struct plan *p, struct mg_comm *c, int rank)
{
    char send[64] = {0}, recv[64];
    int k = rank == 1 && mism_mode == 0 ? 2 : 1;
    size_t len = rank == 1 && mism_mode == 1 ? 32 : 16;
    int rc = mg_comm_shift(c, send, recv, len, k, 5000);
    /* in a ring only the neighbours of rank 1 see its call: the others'
     * shift may finish, and their next call fails */
    if (!rc)
        rc = mg_comm_shift(c, send, recv, len, k, 5000);
    printf("# %s: rank %d: %s\n", p->name, rank, mg_comm_errmsg(c));
    if (!rc)
        return 2;
    return strstr(mg_comm_errmsg(c), mism_mode == 0
                                         ? "rank 1 called shift of 16 bytes per rank by 2"
                                         : "rank 1 called shift of 32 bytes per rank by 1")
               ? 0
               : 1;
}

int main(void)
{
    /* World size 1, and the arguments. */
    struct mg_comm *one;
    char a[8] = "abcdefg", b[8] = "";
    is_int(mg_comm_single_create(&one), 0, "single communicator");
    ok(mg_comm_has_shift(one), "world 1 has a shift");
    is_int(mg_comm_shift(one, a, b, 8, 5, MG_COMM_DEFAULT_TIMEOUT), 0, "world 1: a shift by 5");
    ok(memcmp(a, b, 8) == 0, "world 1: a shift copies");
    is_int(mg_comm_shift(one, a, a + 2, 4, 1, MG_COMM_DEFAULT_TIMEOUT), -EINVAL,
           "overlapping buffers refused");
    is_int(mg_comm_shift(one, NULL, b, 4, 1, MG_COMM_DEFAULT_TIMEOUT), -EINVAL,
           "no send buffer refused");
    mg_comm_release(one);

    /* Layouts, with k = LOCAL_WORLD_SIZE where ranks share hosts. */
    int k_w2[] = {1, -1, 3};
    int k_w3[] = {1, 2, -1};
    int k_w4[] = {1, 2, 3};
    int k_hier4[] = {2, 1, 3, -2};
    int k_w6[] = {2, 4, 1, 5, 3};
    int k_w8[] = {2, 6, 1, 4, 7};
    struct plan shm2 = {"shm w2", 2, {0, 0}}, shm3 = {"shm w3", 3, {0, 0, 0}},
                shm4 = {"shm w4", 4, {0, 0, 0, 0}};
    struct plan ring2 = {"ring w2", 2, {0, 0}, 1}, ring3 = {"ring w3", 3, {0, 0, 0}, 1},
                ring4 = {"ring w4 (one rank per host)", 4, {0, 1, 2, 3}},
                ring4h = {"ring w4 over 2 hosts of 2 (MG_COMM=tcp)", 4, {0, 0, 1, 1}, 1};
    struct plan hier4 = {"hier 2x2", 4, {0, 0, 1, 1}}, hier3 = {"hier 2+1", 3, {0, 0, 1}},
                inter = {"hier interleaved", 4, {0, 1, 0, 1}},
                hier6 = {"hier 3x2", 6, {0, 0, 1, 1, 2, 2}},
                hier8 = {"hier 4x2", 8, {0, 0, 1, 1, 2, 2, 3, 3}},
                hier6u = {"hier 3+2+1", 6, {0, 0, 0, 1, 1, 2}},
                hier4x = {"hier 2x4 interleaved by twos", 8, {0, 0, 1, 1, 0, 0, 1, 1}};
    check_shift(&shm2, k_w2, 3);
    check_shift(&shm3, k_w3, 3);
    check_shift(&shm4, k_w4, 3);
    check_shift(&ring2, k_w2, 3);
    check_shift(&ring3, k_w3, 3);
    check_shift(&ring4, k_w4, 3);
    check_shift(&ring4h, k_hier4, 4);
    check_shift(&hier4, k_hier4, 4);
    check_shift(&hier3, k_w3, 3);
    check_shift(&inter, k_hier4, 4);
    check_shift(&hier6, k_w6, 5);
    check_shift(&hier8, k_w8, 5);
    check_shift(&hier6u, k_w6, 5);
    check_shift(&hier4x, k_w8, 5);

    /* A rank SIGKILLed in the middle of shifts. */
    struct plan killed[] = {
        {"killed shm w3", 3, {0, 0, 0}, 0, 0, 0, 20000},
        {"killed ring w3", 3, {0, 0, 0}, 1, 0, 0, 20000},
        {"killed hier 2x2 (k = 2)", 4, {0, 0, 1, 1}, 0, 0, 0, 20000},
        {"killed hier 3x2 (k = 2, its host's leader)", 6, {0, 0, 1, 1, 2, 2}, 0, 0, 0, 20000},
    };
    int killed_k[] = {1, 1, 2, 2};
    for (size_t i = 0; i < sizeof(killed) / sizeof(killed[0]); i++) {
        int st[MAXW], naming = 0;
        ks[0] = killed_k[i];
        int64_t t0 = mg_now_ms();
        run_job(&killed[i], fn_killed, st);
        int64_t took = mg_now_ms() - t0;
        ok(WIFSIGNALED(st[victim]) && WTERMSIG(st[victim]) == SIGKILL, "%s: victim killed",
           killed[i].name);
        for (int r = 0; r < killed[i].world; r++) {
            if (r == victim)
                continue;
            naming += WIFEXITED(st[r]) && WEXITSTATUS(st[r]) == 0;
            ok(WIFEXITED(st[r]) && WEXITSTATUS(st[r]) <= 1,
               "%s: rank %d fails with a clean error naming the shift (status %d)", killed[i].name,
               r, WIFEXITED(st[r]) ? WEXITSTATUS(st[r]) : -WTERMSIG(st[r]));
        }
        ok(naming >= 1, "%s: at least one rank names rank %d", killed[i].name, victim);
        ok(took < 15000, "%s: no rank waits for its timeout (all done in %lld ms, timeout 20 s)",
           killed[i].name, (long long)took);
    }

    /* A rank that shifts by another k, or another size. */
    struct plan mism[] = {
        {"mismatch shm w3", 3, {0, 0, 0}, 0, 0, 0, 5000},
        {"mismatch ring w3", 3, {0, 0, 0}, 1, 0, 0, 5000},
    };
    for (mism_mode = 0; mism_mode < 2; mism_mode++)
        for (size_t i = 0; i < sizeof(mism) / sizeof(mism[0]); i++) {
            int st[MAXW], naming = 0;
            run_job(&mism[i], fn_mismatch, st);
            for (int r = 0; r < mism[i].world; r++) {
                naming += WIFEXITED(st[r]) && WEXITSTATUS(st[r]) == 0;
                ok(WIFEXITED(st[r]) && WEXITSTATUS(st[r]) <= 1, "%s: another %s: rank %d fails",
                   mism[i].name, mism_mode ? "size" : "k", r);
            }
            ok(naming >= 1, "%s: another %s: a rank names rank 1's call", mism[i].name,
               mism_mode ? "size" : "k");
        }
    return done_testing();
}
