/* The GPU suite's NCCL part, in the style of nccl-tests: ranks are forked
 * processes, one GPU each, bootstrapped through a real store; inputs are small
 * integers in floats, so every sum is exact in any order and the result is
 * compared exactly; every size class up to 256 MiB, every root, in place and
 * out of place, buffers from mem_alloc and from the backend; every rank must
 * hold identical bits (a hash of each result, allgathered). Then SIGKILL of
 * one rank in the middle of allreduces: the others fail within the timeout,
 * with a message that names it; and one rank alive but silent: the others
 * time out, saying every rank is alive. Skips without a GPU; the multi-rank cases
 * skip, saying so, on a machine with one GPU (NCCL refuses two ranks on one
 * device).
 * timeout: 600 */
#include "backend.h"
#include "comm.h"
#include "gpu_test.h"
#include "store.h"
#include "tap.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_WORLD 8

static int port;
static int hang; /* the failure case: the last rank stops calling (alive) instead of dying */

struct report {
    int checks, wrong, rc;
    char first[MG_ERRMSG_LEN]; /* the first wrong check, or the error */
};

struct rank {
    int rank, world;
    struct mg_backend *be;
    struct mg_comm *c;
    struct report *rep;
};

static void wrong(struct rank *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void wrong(struct rank *r, const char *fmt, ...)
{
    r->rep->wrong++;
    if (r->rep->wrong == 1) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r->rep->first, sizeof(r->rep->first), fmt, ap);
        va_end(ap);
    }
}

static uint64_t fnv(const void *p, size_t n)
{
    const unsigned char *b = p;
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ULL;
    return h;
}

/* rank r's element i: an integer, so sums are exact in any order */
static float val(int r, size_t i)
{
    return (float)((r + 1) * ((int)(i % 1021) - 510));
}

/* Every rank holds the same bits: allgather of a hash, through the comm. */
static void same_everywhere(struct rank *r, const void *host, size_t bytes, const char *what)
{
    uint64_t h = fnv(host, bytes), all[MAX_WORLD];
    uint64_t *d = r->be->ops->alloc(r->be, sizeof(all));
    r->be->ops->upload(r->be, d + r->rank, &h, 8);
    r->be->ops->sync(r->be);
    int rc = mg_comm_allgather(r->c, d + r->rank, d, 8, MG_COMM_DEFAULT_TIMEOUT);
    r->be->ops->download(r->be, all, d, 8 * (size_t)r->world);
    r->be->ops->free(r->be, d);
    r->rep->checks++;
    if (rc) {
        wrong(r, "%s: allgather of hashes: %s", what, mg_comm_errmsg(r->c));
        return;
    }
    for (int q = 0; q < r->world; q++)
        if (all[q] != h) {
            wrong(r, "%s: rank %d holds other bits", what, q);
            return;
        }
}

static void check_allreduce(struct rank *r, float *dbuf, size_t count, enum mg_reduce_op op,
                            const char *kind)
{
    size_t bytes = count * sizeof(float);
    float *h = malloc(bytes ? bytes : 4), *want = malloc(bytes ? bytes : 4);
    int W = r->world;
    for (size_t i = 0; i < count; i++) {
        h[i] = val(r->rank, i);
        float sum = (float)(((int)(i % 1021) - 510) * W * (W + 1) / 2);
        want[i] = op == MG_REDUCE_AVG && W > 1 ? sum / (float)W : sum;
    }
    r->be->ops->upload(r->be, dbuf, h, bytes);
    r->be->ops->sync(r->be);
    char what[128];
    snprintf(what, sizeof(what), "allreduce %s of %zu floats (%s)",
             op == MG_REDUCE_AVG ? "avg" : "sum", count, kind);
    int rc = mg_comm_allreduce(r->c, dbuf, count, op, MG_COMM_DEFAULT_TIMEOUT);
    r->rep->checks++;
    if (rc) {
        wrong(r, "%s: %s", what, mg_comm_errmsg(r->c));
    } else {
        r->be->ops->download(r->be, h, dbuf, bytes);
        if (memcmp(h, want, bytes)) {
            size_t bad = 0;
            for (size_t i = 0; i < count; i++)
                bad += memcmp(&h[i], &want[i], 4) != 0;
            wrong(r, "%s: %zu wrong elements", what, bad);
        }
        same_everywhere(r, h, bytes, what);
    }
    free(h);
    free(want);
}

static void check_broadcast(struct rank *r, unsigned char *dbuf, size_t len, int root)
{
    unsigned char *h = malloc(len), *want = malloc(len);
    for (size_t i = 0; i < len; i++) {
        want[i] = (unsigned char)(i * 7 + root);
        h[i] = r->rank == root ? want[i] : 0xee;
    }
    r->be->ops->upload(r->be, dbuf, h, len);
    r->be->ops->sync(r->be);
    int rc = mg_comm_broadcast(r->c, dbuf, len, root, MG_COMM_DEFAULT_TIMEOUT);
    r->rep->checks++;
    if (rc) {
        wrong(r, "broadcast of %zu bytes from %d: %s", len, root, mg_comm_errmsg(r->c));
    } else {
        r->be->ops->download(r->be, h, dbuf, len);
        if (memcmp(h, want, len))
            wrong(r, "broadcast of %zu bytes from %d: wrong bytes", len, root);
    }
    free(h);
    free(want);
}

static void check_allgather(struct rank *r, size_t len, int in_place)
{
    size_t total = len * (size_t)r->world;
    unsigned char *h = malloc(total), *want = malloc(total);
    unsigned char *recv = r->be->ops->alloc(r->be, total);
    unsigned char *send = in_place ? recv + (size_t)r->rank * len : r->be->ops->alloc(r->be, len);
    for (int q = 0; q < r->world; q++)
        for (size_t i = 0; i < len; i++)
            want[(size_t)q * len + i] = (unsigned char)(q * 31 + i);
    r->be->ops->upload(r->be, send, want + (size_t)r->rank * len, len);
    r->be->ops->sync(r->be);
    int rc = mg_comm_allgather(r->c, send, recv, len, MG_COMM_DEFAULT_TIMEOUT);
    r->rep->checks++;
    if (rc) {
        wrong(r, "allgather of %zu bytes (%s): %s", len, in_place ? "in place" : "out of place",
              mg_comm_errmsg(r->c));
    } else {
        r->be->ops->download(r->be, h, recv, total);
        if (memcmp(h, want, total))
            wrong(r, "allgather of %zu bytes (%s): wrong bytes", len,
                  in_place ? "in place" : "out of place");
    }
    if (!in_place)
        r->be->ops->free(r->be, send);
    r->be->ops->free(r->be, recv);
    free(h);
    free(want);
}

static void check_reduce_scatter(struct rank *r, size_t count, enum mg_reduce_op op, int in_place)
{
    int W = r->world;
    size_t total = count * (size_t)W;
    float *h = malloc(total * 4), *want = malloc(count * 4);
    float *send = r->be->ops->alloc(r->be, total * 4);
    float *recv = in_place ? send + (size_t)r->rank * count : r->be->ops->alloc(r->be, count * 4);
    for (size_t i = 0; i < total; i++)
        h[i] = val(r->rank, i);
    for (size_t i = 0; i < count; i++) {
        size_t j = (size_t)r->rank * count + i;
        float sum = (float)(((int)(j % 1021) - 510) * W * (W + 1) / 2);
        want[i] = op == MG_REDUCE_AVG && W > 1 ? sum / (float)W : sum;
    }
    r->be->ops->upload(r->be, send, h, total * 4);
    r->be->ops->sync(r->be);
    int rc = mg_comm_reduce_scatter(r->c, send, recv, count, op, MG_COMM_DEFAULT_TIMEOUT);
    r->rep->checks++;
    if (rc) {
        wrong(r, "reduce-scatter of %zu floats: %s", count, mg_comm_errmsg(r->c));
    } else {
        r->be->ops->download(r->be, h, recv, count * 4);
        if (memcmp(h, want, count * 4))
            wrong(r, "reduce-scatter %s of %zu floats (%s): wrong values",
                  op == MG_REDUCE_AVG ? "avg" : "sum", count,
                  in_place ? "in place" : "out of place");
    }
    if (!in_place)
        r->be->ops->free(r->be, recv);
    r->be->ops->free(r->be, send);
    free(h);
    free(want);
}

/* A collective ordered after an event of the compute stream: the data it
 * reduces is what the kernel before the event wrote. */
static void check_wait_event(struct rank *r)
{
    size_t n = 1 << 20;
    float *h = malloc(n * 4), *d = r->be->ops->alloc(r->be, n * 4);
    for (size_t i = 0; i < n; i++)
        h[i] = val(r->rank, i);
    r->be->ops->upload(r->be, d, h, n * 4);
    r->be->ops->scale(r->be, d, 2.0f, n); /* queued, not waited for */
    void *ev = mg_backend_event_record(r->be);
    int rc = mg_comm_wait_event(r->c, ev);
    if (!rc)
        rc = mg_comm_allreduce(r->c, d, n, MG_REDUCE_SUM, MG_COMM_DEFAULT_TIMEOUT);
    mg_backend_event_release(r->be, ev);
    r->rep->checks++;
    if (rc) {
        wrong(r, "allreduce after wait_event: %s", mg_comm_errmsg(r->c));
    } else {
        r->be->ops->download(r->be, h, d, n * 4);
        int W = r->world;
        for (size_t i = 0; i < n; i++)
            if (h[i] != (float)(2 * ((int)(i % 1021) - 510) * W * (W + 1) / 2)) {
                wrong(r, "allreduce after wait_event: element %zu is %g", i, h[i]);
                break;
            }
    }
    r->be->ops->free(r->be, d);
    free(h);
}

/* DDP's way: four slices of one buffer, from the end back, each after an event of
 * the compute that wrote it, queued one behind the other with no wait, then one
 * wait for all (averages of integers times 2: exact). */
static void check_queued(struct rank *r)
{
    size_t n = 1 << 22, part = n / 4;
    float *h = malloc(n * 4), *d = r->be->ops->alloc(r->be, n * 4);
    int rc = 0, W = r->world;
    for (size_t i = 0; i < n; i++)
        h[i] = val(r->rank, i);
    r->be->ops->upload(r->be, d, h, n * 4);
    for (int k = 3; k >= 0 && !rc; k--) {
        r->be->ops->scale(r->be, d + (size_t)k * part, 2.0f, part); /* queued, not waited for */
        void *ev = mg_backend_event_record(r->be);
        rc = mg_comm_wait_event(r->c, ev);
        if (!rc)
            rc = mg_comm_allreduce_queue(r->c, d + (size_t)k * part, part, MG_REDUCE_AVG,
                                         MG_COMM_DEFAULT_TIMEOUT);
        mg_backend_event_release(r->be, ev);
    }
    if (!rc)
        rc = mg_comm_wait_queued(r->c, MG_COMM_DEFAULT_TIMEOUT);
    r->rep->checks++;
    if (rc) {
        wrong(r, "queued allreduces: %s", mg_comm_errmsg(r->c));
    } else {
        r->be->ops->download(r->be, h, d, n * 4);
        for (size_t i = 0; i < n; i++) {
            float sum = (float)(2 * ((int)(i % 1021) - 510) * W * (W + 1) / 2);
            if (h[i] != (W > 1 ? sum / (float)W : sum)) {
                wrong(r, "queued allreduces: element %zu is %g", i, h[i]);
                break;
            }
        }
    }
    r->be->ops->free(r->be, d);
    free(h);
}

static void rank_main(struct rank *r, int kill_at)
{
    static const size_t counts[] = {1, 2, 31, 1023, 1025, 65537, 1 << 20, (size_t)64 << 20};
    size_t maxc = (size_t)64 << 20;
    float *plain = r->be->ops->alloc(r->be, maxc * 4), *reg = NULL;
    if (mg_comm_mem_alloc(r->c, maxc * 4, (void **)&reg, MG_COMM_DEFAULT_TIMEOUT) < 0)
        wrong(r, "mem_alloc of 256 MiB: %s", mg_comm_errmsg(r->c));
    if (kill_at >= 0) {
        /* the failure case: allreduces until one rank dies in the middle of them */
        for (int it = 0;; it++) {
            if (r->rank == r->world - 1 && it == kill_at) {
                if (!hang)
                    raise(SIGKILL);
                sleep(25); /* alive and silent past the others' timeout */
            }
            int rc = mg_comm_allreduce(r->c, plain, maxc, MG_REDUCE_SUM, MG_COMM_DEFAULT_TIMEOUT);
            if (rc) {
                r->rep->rc = rc;
                snprintf(r->rep->first, sizeof(r->rep->first), "%s", mg_comm_errmsg(r->c));
                return;
            }
        }
    }
    for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++) {
        check_allreduce(r, plain, counts[k], MG_REDUCE_SUM, "backend memory");
        if (reg)
            check_allreduce(r, reg, counts[k], MG_REDUCE_SUM, "registered memory");
        check_allreduce(r, plain, counts[k], MG_REDUCE_AVG, "backend memory");
    }
    static const size_t lens[] = {1, 4099, 1 << 20, (size_t)256 << 20};
    for (size_t k = 0; k < sizeof(lens) / sizeof(lens[0]); k++)
        for (int root = 0; root < r->world; root++)
            check_broadcast(r, (unsigned char *)plain, lens[k], root);
    for (size_t k = 0; k < 3; k++)
        for (int in_place = 0; in_place < 2; in_place++)
            check_allgather(r, lens[k], in_place);
    for (int in_place = 0; in_place < 2; in_place++) {
        check_reduce_scatter(r, 1, MG_REDUCE_SUM, in_place);
        check_reduce_scatter(r, 4099, MG_REDUCE_AVG, in_place);
        check_reduce_scatter(r, 1 << 20, MG_REDUCE_SUM, in_place);
    }
    check_wait_event(r);
    check_queued(r);
    for (int i = 0; i < 3; i++) {
        r->rep->checks++;
        if (mg_comm_barrier(r->c, MG_COMM_DEFAULT_TIMEOUT))
            wrong(r, "barrier: %s", mg_comm_errmsg(r->c));
    }
    if (reg)
        mg_comm_mem_free(r->c, reg);
    r->be->ops->free(r->be, plain);
}

/* Forks world ranks on GPUs 0..world-1; rep[] gets each one's report. */
static void run_world(int world, int kill_at, int timeout_ms, const char *run_id,
                      struct report *rep, double *seconds)
{
    pid_t pids[MAX_WORLD];
    int fds[MAX_WORLD];
    struct timespec t0, t1;
    struct mg_store_server *srv;
    struct mg_store_server_opts sso = {.host = "127.0.0.1", .port = 0, .listen_fd = -1};
    /* a store per job, as each job of mglaunch has */
    if (mg_store_server_start(&srv, &sso) < 0 || mg_store_server_start_thread(srv) < 0)
        BAIL_OUT("cannot start a store");
    port = mg_store_server_port(srv);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int q = 0; q < world; q++) {
        int p[2];
        if (pipe(p) != 0)
            BAIL_OUT("pipe");
        fflush(stdout);
        pids[q] = fork();
        if (pids[q] < 0)
            BAIL_OUT("fork");
        if (pids[q] == 0) {
            close(p[0]);
            struct report rp = {0};
            struct rank r = {.rank = q, .world = world, .rep = &rp};
            char err[MG_ERRMSG_LEN];
            struct mg_store *st = NULL;
            struct mg_store_opts so = {.host = "127.0.0.1", .port = port, .timeout_ms = 60000};
            struct mg_backend_opts bo = {.device_index = q};
            rp.rc = mg_store_connect(&st, &so);
            if (rp.rc == 0)
                rp.rc = mg_backend_open(MG_DEVICE_CUDA, &bo, &r.be, rp.first, sizeof(rp.first));
            if (rp.rc == 0) {
                struct mg_comm_opts co = {.rank = q,
                                          .world = world,
                                          .mode = MG_COMM_NCCL,
                                          .timeout_ms = timeout_ms,
                                          .init_timeout_ms = 60000,
                                          .run_id = run_id,
                                          .device_index = q,
                                          .stream = r.be->stream};
                rp.rc = mg_comm_nccl_create(&r.c, st, &co, err, sizeof(err));
                if (rp.rc)
                    snprintf(rp.first, sizeof(rp.first), "%s", err);
            }
            if (rp.rc == 0) {
                if (q == 0)
                    printf("# %s\n", r.c->desc);
                rank_main(&r, kill_at);
                if (kill_at < 0)
                    rp.rc = mg_comm_barrier(r.c, MG_COMM_DEFAULT_TIMEOUT);
                mg_comm_release(r.c);
            }
            if (r.be)
                mg_backend_release(r.be);
            ssize_t w = write(p[1], &rp, sizeof(rp));
            if (st)
                mg_store_release(st);
            fflush(stdout);
            _exit(w == (ssize_t)sizeof(rp) ? 0 : 1);
        }
        close(p[1]);
        fds[q] = p[0];
    }
    for (int q = 0; q < world; q++) {
        size_t got = 0;
        ssize_t k;
        memset(&rep[q], 0, sizeof(rep[q]));
        while (got < sizeof(rep[q]) &&
               (k = read(fds[q], (char *)&rep[q] + got, sizeof(rep[q]) - got)) > 0)
            got += (size_t)k;
        close(fds[q]);
        int status;
        waitpid(pids[q], &status, 0);
        if (got != sizeof(rep[q])) {
            rep[q].rc = -EPIPE;
            snprintf(rep[q].first, sizeof(rep[q].first), "the rank's process ended (%s %d)",
                     WIFSIGNALED(status) ? "signal" : "status",
                     WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    *seconds = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
    mg_store_server_release(srv);
}

int main(void)
{
    struct report rep[MAX_WORLD];
    double secs;
    char run[32];
    int devices = gpu_test_device_or_skip(0);
    signal(SIGPIPE, SIG_IGN);
    diag("%d CUDA device%s", devices, devices == 1 ? "" : "s");

    for (int world = 1; world <= MAX_WORLD; world *= 2) {
        if (world > devices) {
            ok(1,
               "# SKIP %d ranks: this machine has %d GPU%s, and NCCL refuses two ranks on one "
               "device",
               world, devices, devices == 1 ? "" : "s");
            continue;
        }
        snprintf(run, sizeof(run), "nccl-%d", world);
        run_world(world, -1, 120000, run, rep, &secs);
        for (int q = 0; q < world; q++)
            ok(rep[q].rc == 0 && rep[q].wrong == 0, "%d ranks, rank %d: %d checks, %d wrong%s%s",
               world, q, rep[q].checks, rep[q].wrong, rep[q].first[0] ? ": " : "", rep[q].first);
        diag("%d ranks: %.1f s", world, secs);
    }

    if (devices < 2) {
        ok(1, "# SKIP a rank killed mid-allreduce: needs 2 GPUs (this machine has %d)", devices);
    } else {
        int world = devices < 4 ? devices : 4;
        run_world(world, 3, 20000, "nccl-kill", rep, &secs);
        for (int q = 0; q < world - 1; q++) {
            char who[32];
            snprintf(who, sizeof(who), "rank %d", world - 1);
            ok(rep[q].rc < 0 && strstr(rep[q].first, who),
               "rank %d, when rank %d is killed mid-allreduce: fails naming it: %s", q, world - 1,
               rep[q].first);
        }
        diag("the survivors gave up after %.1f s (collective timeout 20 s)", secs);
        hang = 1;
        run_world(world, 3, 10000, "nccl-hang", rep, &secs);
        for (int q = 0; q < world - 1; q++)
            ok(rep[q].rc == -ETIMEDOUT && strstr(rep[q].first, "timed out after 10 s") &&
                   strstr(rep[q].first, "every rank is alive"),
               "rank %d, when rank %d stops calling: times out, saying every rank is alive: %s", q,
               world - 1, rep[q].first);
        diag("with a silent rank: %.1f s in all (collective timeout 10 s)", secs);
    }
    return done_testing();
}
