/* The NCCL communicator (struct mg_comm_ops on NCCL; contract in comm.h).
 *
 * Bootstrap through the store the CPU communicator uses, under keys scoped to
 * the run and the restart (mg/nccl/<run>/<restart>/...), so a restarted group
 * never reads an id or a failure of the attempt before:
 *   id          rank 0's ncclUniqueId ("I" + 128 bytes), or why it has none ("E" + text)
 *   up/<r>      rank r has started (persistent)
 *   alive/<r>   rank r's store connection is open (ephemeral: it goes when the
 *               process dies, so up without alive means a dead rank)
 *   fail/<r>    what went wrong on rank r (persistent, first failure only)
 * NCCL starts non-blocking (ncclCommInitRankConfig, blocking = 0) and is
 * polled against the init timeout; then an allgather of host identities
 * proves every path and gives the host layout.
 *
 * Every collective is queued on the communicator's stream behind an event of
 * the compute stream (comm.h: wait_event) and polled (ncclCommGetAsyncError,
 * cudaStreamQuery) until done, NCCL's error, or the deadline. A wait that
 * passes a second looks at the store once a second: a rank that reported a
 * failure or died ends the wait at once. On any failure the communicator is
 * aborted (ncclCommAbort) and broken, its message names the operation and,
 * when the store knows, the rank, and this rank's failure goes to the store
 * for the others. AVG is a sum then our divide kernel, as the CPU does it.
 * The waits, the store's news and the broken state are comm_nccl_watch.c's. */
#include "comm_nccl_internal.h"
#include "cuda_kernels.h"

#include <cuda_runtime.h>
#include <errno.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define FINALIZE_MS     10000
#define STORE_EPHEMERAL 1 /* MG_STORE_EPHEMERAL (store.h) */

/* The key prefix of a run and restart; the run id is reduced to safe characters. */
static void key_prefix(const struct mg_comm_opts *opts, char *buf, size_t len)
{
    char run[130];
    const char *in = opts->run_id && *opts->run_id ? opts->run_id : "none";
    size_t j = 0;
    for (; *in && j + 1 < sizeof(run); in++) {
        char ch = *in;
        int keep = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                   (ch >= '0' && ch <= '9') || ch == '_' || ch == '.' || ch == '-';
        run[j++] = keep ? ch : '_';
    }
    run[j] = '\0';
    snprintf(buf, len, "mg/nccl/%s/%d/", run, opts->restart_count);
}

/* ---- the collectives ------------------------------------------------------------------------- */

static struct nccl_comm *N(struct mg_comm *c)
{
    return (struct nccl_comm *)c;
}

/* A collective of nothing: done, and it takes wait_event's event with it, so
 * that a later one cannot follow that event instead of all the work before it. */
static int nothing(struct nccl_comm *n)
{
    n->pending = NULL;
    return 0;
}

static int nccl_allreduce(struct mg_comm *c, float *buf, size_t count, enum mg_reduce_op op,
                          int timeout_ms)
{
    struct nccl_comm *n = N(c);
    char what[96];
    snprintf(what, sizeof(what), "allreduce%s of %zu float%s", op == MG_REDUCE_AVG ? " (avg)" : "",
             count, count == 1 ? "" : "s");
    if (!count)
        return nothing(n);
    int rc = mgcu_nccl_prepare(n, what);
    if (rc)
        return rc;
    ncclResult_t r = ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, n->nc, n->stream);
    return mgcu_nccl_finish(n, what, timeout_ms, r,
                            op == MG_REDUCE_AVG && c->world > 1 ? buf : NULL, count);
}

static int queue_events(struct nccl_comm *n, struct mgcu_err *e)
{
    for (int i = 0; i < MAX_QUEUED; i++)
        if (CU_FAILED(e, cudaEventCreateWithFlags(&n->qev[i], cudaEventDisableTiming)))
            return 1;
    return 0;
}

static int nccl_wait_queued(struct mg_comm *c, int timeout_ms)
{
    struct nccl_comm *n = N(c);
    struct waiter w;
    mgcu_nccl_wait_begin(&w, timeout_ms);
    for (int i = 0; i < n->nq; i++) {
        int rc = mgcu_nccl_drained(n, n->qwhat[i], &w, n->qev[i]);
        if (rc)
            return rc;
    }
    n->nq = 0;
    return 0;
}

/* Queued behind the ones before it on NCCL's stream, in the order the calls
 * come (DDP's bucket order, the same on every rank); the host waits only for
 * NCCL to take it. */
static int nccl_allreduce_queue(struct mg_comm *c, float *buf, size_t count, enum mg_reduce_op op,
                                int timeout_ms)
{
    struct nccl_comm *n = N(c);
    struct mgcu_err e = {0};
    struct waiter w;
    char what[96];
    int rc;
    if (n->nq == MAX_QUEUED && (rc = nccl_wait_queued(c, timeout_ms)) != 0)
        return rc;
    snprintf(what, sizeof(what), "allreduce%s of %zu float%s", op == MG_REDUCE_AVG ? " (avg)" : "",
             count, count == 1 ? "" : "s");
    if (!count)
        return nothing(n);
    if ((rc = mgcu_nccl_prepare(n, what)) != 0)
        return rc;
    mgcu_nccl_wait_begin(&w, timeout_ms);
    ncclResult_t r = ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, n->nc, n->stream);
    rc = mgcu_nccl_taken(n, what, &w, r, op == MG_REDUCE_AVG && c->world > 1 ? buf : NULL, count);
    if (rc)
        return rc;
    if (CU_FAILED(&e, cudaEventRecord(n->qev[n->nq], n->stream)))
        return mgcu_nccl_broken(n, e.code, "%s: %s", what, e.msg);
    snprintf(n->qwhat[n->nq++], sizeof(n->qwhat[0]), "%s", what);
    return 0;
}

static int nccl_reduce_scatter(struct mg_comm *c, const float *send, float *recv, size_t recv_count,
                               enum mg_reduce_op op, int timeout_ms)
{
    struct nccl_comm *n = N(c);
    char what[96];
    snprintf(what, sizeof(what), "reduce-scatter%s of %zu float%s per rank",
             op == MG_REDUCE_AVG ? " (avg)" : "", recv_count, recv_count == 1 ? "" : "s");
    if (!recv_count)
        return nothing(n);
    int rc = mgcu_nccl_prepare(n, what);
    if (rc)
        return rc;
    ncclResult_t r =
        ncclReduceScatter(send, recv, recv_count, ncclFloat, ncclSum, n->nc, n->stream);
    return mgcu_nccl_finish(n, what, timeout_ms, r,
                            op == MG_REDUCE_AVG && c->world > 1 ? recv : NULL, recv_count);
}

static int nccl_broadcast(struct mg_comm *c, void *buf, size_t len, int root, int timeout_ms)
{
    struct nccl_comm *n = N(c);
    char what[96];
    snprintf(what, sizeof(what), "broadcast of %zu byte%s from rank %d", len, len == 1 ? "" : "s",
             root);
    if (!len)
        return nothing(n);
    int rc = mgcu_nccl_prepare(n, what);
    if (rc)
        return rc;
    ncclResult_t r = ncclBroadcast(buf, buf, len, ncclUint8, root, n->nc, n->stream);
    return mgcu_nccl_finish(n, what, timeout_ms, r, NULL, 0);
}

static int nccl_allgather(struct mg_comm *c, const void *send, void *recv, size_t len,
                          int timeout_ms)
{
    struct nccl_comm *n = N(c);
    char what[96];
    snprintf(what, sizeof(what), "allgather of %zu byte%s per rank", len, len == 1 ? "" : "s");
    if (!len)
        return nothing(n);
    int rc = mgcu_nccl_prepare(n, what);
    if (rc)
        return rc;
    ncclResult_t r = ncclAllGather(send, recv, len, ncclUint8, n->nc, n->stream);
    return mgcu_nccl_finish(n, what, timeout_ms, r, NULL, 0);
}

static int nccl_barrier(struct mg_comm *c, int timeout_ms)
{
    struct nccl_comm *n = N(c);
    int rc = mgcu_nccl_prepare(n, "barrier");
    if (rc)
        return rc;
    /* one float (NCCL counts elements, not bytes), always zero */
    ncclResult_t r = ncclAllReduce(n->zero, n->zero, 1, ncclFloat, ncclSum, n->nc, n->stream);
    return mgcu_nccl_finish(n, "barrier", timeout_ms, r, NULL, 0);
}

static int nccl_wait_event(struct mg_comm *c, void *event)
{
    N(c)->pending = (cudaEvent_t)event;
    return 0;
}

/* NCCL's own allocation, registered with the communicator, where it has one;
 * else cudaMalloc, aligned to 4096 by hand. */
static int nccl_mem_alloc(struct mg_comm *c, size_t bytes, void **out, int timeout_ms)
{
    struct nccl_comm *n = N(c);
    struct mgcu_err e = {0};
    struct reg *slot = NULL;
    for (int i = 0; i < MAX_REGS && !slot; i++)
        if (!n->regs[i].user)
            slot = &n->regs[i];
    if (!slot || CU_FAILED(&e, cudaSetDevice(n->device)))
        return -ENOMEM;
    memset(slot, 0, sizeof(*slot));
    if (ncclMemAlloc(&slot->base, bytes) == ncclSuccess) {
        slot->nccl_mem = 1;
        slot->user = slot->base;
    } else if (cudaMalloc(&slot->base, bytes + 4096) == cudaSuccess) {
        slot->user = (void *)(((uintptr_t)slot->base + 4095) & ~(uintptr_t)4095);
    } else {
        cudaGetLastError();
        memset(slot, 0, sizeof(*slot));
        return -ENOMEM;
    }
    if (CU_FAILED(&e, cudaMemsetAsync(slot->user, 0, bytes, n->stream)) ||
        CU_FAILED(&e, cudaStreamSynchronize(n->stream))) {
        if (slot->nccl_mem)
            ncclMemFree(slot->base);
        else
            cudaFree(slot->base);
        memset(slot, 0, sizeof(*slot));
        return mgcu_nccl_broken(n, e.code, "registration of %zu bytes: %s", bytes, e.msg);
    }
    if (slot->nccl_mem) {
        /* registration only makes it faster: without it the memory works as well */
        struct waiter w;
        char news[440];
        ncclResult_t r = ncclCommRegister(n->nc, slot->user, bytes, &slot->handle), a = r;
        mgcu_nccl_wait_begin(&w, timeout_ms);
        while (r == ncclInProgress && ncclCommGetAsyncError(n->nc, &a) == ncclSuccess &&
               a == ncclInProgress && mgcu_nccl_wait_tick(n, &w, news, sizeof(news)) == 0)
            ;
        if (a != ncclSuccess)
            slot->handle = NULL;
    }
    *out = slot->user;
    return 0;
}

static void nccl_mem_free(struct mg_comm *c, void *p)
{
    struct nccl_comm *n = N(c);
    for (int i = 0; i < MAX_REGS; i++) {
        struct reg *r = &n->regs[i];
        if (r->user != p)
            continue;
        cudaSetDevice(n->device);
        cudaStreamSynchronize(n->stream);
        if (r->handle && n->nc)
            ncclCommDeregister(n->nc, r->handle);
        if (r->nccl_mem)
            ncclMemFree(r->base);
        else
            cudaFree(r->base);
        memset(r, 0, sizeof(*r));
        return;
    }
}

static void destroy(struct nccl_comm *n)
{
    if (n->stream)
        cudaSetDevice(n->device); /* the releasing thread may not be the creating one */
    if (n->nc) {
        /* flush, then free; a peer that never finalizes must not hold us */
        ncclResult_t a = ncclCommFinalize(n->nc);
        int64_t until = mgcu_now_ms() + FINALIZE_MS;
        while (a == ncclInProgress && mgcu_now_ms() < until) {
            mgcu_nap_us(1000);
            if (ncclCommGetAsyncError(n->nc, &a) != ncclSuccess)
                a = ncclInternalError;
        }
        if (a == ncclSuccess)
            ncclCommDestroy(n->nc);
        else
            ncclCommAbort(n->nc);
        n->nc = NULL;
    }
    for (int i = 0; i < MAX_REGS; i++)
        if (n->regs[i].user)
            nccl_mem_free(&n->c, n->regs[i].user);
    if (n->zero)
        cudaFree(n->zero);
    if (n->order)
        cudaEventDestroy(n->order);
    for (int i = 0; i < MAX_QUEUED; i++)
        if (n->qev[i])
            cudaEventDestroy(n->qev[i]);
    if (n->stream)
        cudaStreamDestroy(n->stream);
    free(n);
}

static void nccl_release(struct mg_comm *c)
{
    destroy(N(c));
}

static const struct mg_comm_ops nccl_ops = {
    .name = "nccl",
    .allreduce = nccl_allreduce,
    .broadcast = nccl_broadcast,
    .allgather = nccl_allgather,
    .barrier = nccl_barrier,
    .release = nccl_release,
    .mem_alloc = nccl_mem_alloc,
    .mem_free = nccl_mem_free,
    .reduce_scatter = nccl_reduce_scatter,
    .wait_event = nccl_wait_event,
    .allreduce_queue = nccl_allreduce_queue,
    .wait_queued = nccl_wait_queued,
};

/* ---- bootstrap ---------------------------------------------------------------------------- */

int mgcu_nccl_exchange_id(struct mg_store *store, const struct mg_comm_opts *opts,
                          unsigned char id[MG_NCCL_ID_BYTES], char *err, size_t errlen)
{
    char prefix[200], k[256], text[MG_ERRMSG_LEN];
    unsigned char val[1 + MG_NCCL_ID_BYTES];
    int timeout = opts->init_timeout_ms > 0 ? opts->init_timeout_ms
                  : opts->timeout_ms > 0    ? opts->timeout_ms
                                            : MG_COMM_TIMEOUT_DEFAULT_MS;
    int rc;
    key_prefix(opts, prefix, sizeof(prefix));
    snprintf(k, sizeof(k), "%sid", prefix);
    if (opts->rank == 0) {
        ncclUniqueId uid;
        ncclResult_t r = ncclGetUniqueId(&uid);
        if (r != ncclSuccess) {
            mgcu_nccl_text(r, NULL, text, sizeof(text));
            /* the others learn it now, not at their timeout */
            char e[MG_ERRMSG_LEN + 1];
            int n = snprintf(e, sizeof(e), "E%s", text);
            mgcu_host->store_set(store, k, e, (size_t)n < sizeof(e) ? (size_t)n : sizeof(e) - 1, 0);
            return mgcu_seterr(err, errlen, -EIO, "ncclGetUniqueId: %s", text);
        }
        val[0] = 'I';
        memcpy(val + 1, uid.internal, MG_NCCL_ID_BYTES);
        memcpy(id, uid.internal, MG_NCCL_ID_BYTES);
        rc = mgcu_host->store_set(store, k, val, sizeof(val), 0);
        if (rc < 0)
            return mgcu_seterr(err, errlen, rc, "publishing the NCCL id in the store (%s): %s", k,
                               mgcu_nccl_why(rc));
        return 0;
    }
    void *got = NULL;
    size_t len = 0;
    rc = mgcu_host->store_get(store, k, &got, &len, timeout);
    if (rc < 0)
        return mgcu_seterr(err, errlen, rc, "waiting for rank 0's NCCL id (store key %s): %s", k,
                           rc == -ETIMEDOUT ? "timed out" : mgcu_nccl_why(rc));
    const unsigned char *g = got;
    if (len >= 1 && g[0] == 'E') {
        rc = mgcu_seterr(err, errlen, -MG_EPEER, "rank 0 could not make the NCCL id: %.*s",
                         (int)(len - 1 < 300 ? len - 1 : 300), (const char *)g + 1);
    } else if (len != sizeof(val) || g[0] != 'I') {
        rc =
            mgcu_seterr(err, errlen, -MG_EPROTO,
                        "the NCCL id in the store (%s) is %zu bytes, not %zu", k, len, sizeof(val));
    } else {
        memcpy(id, g + 1, MG_NCCL_ID_BYTES);
        rc = 0;
    }
    free(got);
    return rc;
}

static uint64_t host_hash(void)
{
    char buf[256] = "";
    FILE *fp = fopen("/proc/sys/kernel/random/boot_id", "re");
    if (fp) {
        if (!fgets(buf, 64, fp))
            buf[0] = '\0';
        fclose(fp);
    }
    size_t l = strlen(buf);
    gethostname(buf + l, sizeof(buf) - l - 1);
    buf[sizeof(buf) - 1] = '\0';
    uint64_t h = 1469598103934665603ULL;
    for (const unsigned char *p = (const unsigned char *)buf; *p; p++)
        h = (h ^ *p) * 1099511628211ULL;
    return h;
}

/* An allgather of every rank's host: proves each path works, and gives the layout. */
static int learn_layout(struct nccl_comm *n, int timeout_ms)
{
    struct mg_comm *c = &n->c;
    struct mgcu_err e = {0};
    uint64_t mine = host_hash(), *all = calloc((size_t)c->world, sizeof(uint64_t));
    void *dev = NULL;
    int rc = -ENOMEM;
    if (!all)
        return mgcu_nccl_broken(n, -ENOMEM, "communicator setup: out of memory");
    /* On NCCL's own stream, so the allgather reads the slot after the copy: a cudaMemcpy
     * from pageable memory returns once the bytes are staged, on the legacy stream, which
     * the non-blocking NCCL stream does not wait for. (No call here may use the legacy
     * stream: tests/integration/cuda_build.t.) */
    if (CU_FAILED(&e, cudaMalloc(&dev, (size_t)c->world * 8)) ||
        CU_FAILED(&e, cudaMemcpyAsync((char *)dev + (size_t)c->rank * 8, &mine, 8,
                                      cudaMemcpyHostToDevice, n->stream))) {
        rc = mgcu_nccl_broken(n, e.code, "communicator setup: %s", e.msg);
        goto out;
    }
    rc = nccl_allgather(c, (char *)dev + (size_t)c->rank * 8, dev, 8, timeout_ms);
    if (rc)
        goto out;
    if (CU_FAILED(&e, cudaMemcpyAsync(all, dev, (size_t)c->world * 8, cudaMemcpyDeviceToHost,
                                      n->stream)) ||
        CU_FAILED(&e, cudaStreamSynchronize(n->stream))) {
        rc = mgcu_nccl_broken(n, e.code, "communicator setup: %s", e.msg);
        goto out;
    }
    c->local_rank = c->local_world = c->nhosts = 0;
    for (int r = 0; r < c->world; r++) {
        int first = 1;
        for (int q = 0; q < r && first; q++)
            first = all[q] != all[r];
        c->nhosts += first;
        if (all[r] == mine) {
            c->local_world++;
            if (r < c->rank)
                c->local_rank++;
        }
    }
    rc = 0;
out:
    if (dev)
        cudaFree(dev);
    free(all);
    return rc;
}

int mgcu_comm_create(struct mg_comm **out, struct mg_store *store, const struct mg_comm_opts *opts,
                     char *err, size_t errlen)
{
    struct nccl_comm *n;
    struct mgcu_err e = {0};
    unsigned char id[MG_NCCL_ID_BYTES];
    char k[256], text[MG_ERRMSG_LEN], news[440];
    int rc, rank = opts->rank, world = opts->world;
    int timeout = opts->timeout_ms > 0 ? opts->timeout_ms : MG_COMM_TIMEOUT_DEFAULT_MS;
    int init_timeout = opts->init_timeout_ms > 0 ? opts->init_timeout_ms : timeout;

    *out = NULL;
    if (world < 1 || rank < 0 || rank >= world || !store)
        return mgcu_seterr(err, errlen, -EINVAL,
                           "invalid rank %d / world size %d for the NCCL communicator", rank,
                           world);
    n = calloc(1, sizeof(*n));
    if (!n)
        return mgcu_seterr(err, errlen, -ENOMEM, "out of memory");
    n->c.ops = &nccl_ops;
    n->c.rank = rank;
    n->c.world = world;
    n->c.timeout_ms = timeout;
    n->c.device_memory = 1;
    n->store = store;
    n->wait_on = (cudaStream_t)opts->stream;
    key_prefix(opts, n->prefix, sizeof(n->prefix));

    /* here and alive (the latter goes with this process's store connection) */
    snprintf(text, sizeof(text), "pid %d", (int)getpid());
    mgcu_nccl_key(n, k, sizeof(k), "alive", rank);
    rc = mgcu_host->store_set(store, k, text, strlen(text), STORE_EPHEMERAL);
    if (rc == 0) {
        mgcu_nccl_key(n, k, sizeof(k), "up", rank);
        rc = mgcu_host->store_set(store, k, text, strlen(text), 0);
    }
    if (rc < 0) {
        mgcu_seterr(err, errlen, rc, "registering rank %d in the store: %s", rank,
                    mgcu_nccl_why(rc));
        goto fail;
    }

    /* NCCL_COMM_BLOCKING=1 overrides the config's blocking = 0 below (NCCL's init.cc): setup
     * and abort would then block inside NCCL, where the init timeout and the news of a rank
     * that never started cannot run, and a missing rank would hang this one. */
    const char *blocking = getenv("NCCL_COMM_BLOCKING");
    if (blocking && strtol(blocking, NULL, 10) == 1) {
        rc = mgcu_seterr(err, errlen, -EINVAL,
                         "NCCL_COMM_BLOCKING=%.16s is set: it makes NCCL's setup block where mg "
                         "cannot time it out or learn that a rank never started; unset it (mg "
                         "polls a non-blocking communicator, and its collectives wait on the "
                         "stream either way)",
                         blocking);
        goto fail_told;
    }

    rc = mgcu_nccl_exchange_id(store, opts, id, err, errlen);
    if (rc < 0)
        goto fail_told;

    /* -1: the caller's current device, which NCCL takes and reports below */
    if (opts->device_index >= 0 && CU_FAILED(&e, cudaSetDevice(opts->device_index))) {
        rc = mgcu_seterr(err, errlen, e.code, "device %d: %s", opts->device_index, e.msg);
        goto fail_told;
    }

    /* non-blocking: this thread polls, so a rank that never comes cannot hold it */
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    ncclUniqueId uid;
    cfg.blocking = 0;
    memcpy(uid.internal, id, sizeof(uid.internal));
    ncclResult_t r = ncclCommInitRankConfig(&n->nc, world, uid, rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        mgcu_nccl_text(r, n->nc, text, sizeof(text));
        rc = mgcu_seterr(err, errlen, -EIO, "ncclCommInitRankConfig: %s", text);
        goto fail_told;
    }
    struct waiter w;
    mgcu_nccl_wait_begin(&w, init_timeout);
    for (;;) {
        ncclResult_t a = ncclInternalError;
        if (n->nc && ncclCommGetAsyncError(n->nc, &a) != ncclSuccess)
            a = ncclInternalError;
        if (a == ncclSuccess)
            break;
        if (a != ncclInProgress) {
            mgcu_nccl_text(a, n->nc, text, sizeof(text));
            rc = mgcu_seterr(err, errlen, a == ncclRemoteError ? -MG_EPEER : -EIO,
                             "ncclCommInitRankConfig: %s", text);
            goto fail_told;
        }
        rc = mgcu_nccl_wait_tick(n, &w, news, sizeof(news));
        if (rc < 0) {
            mgcu_seterr(err, errlen, rc, "NCCL setup: %s", news);
            goto fail_told;
        }
    }
    if (ncclCommCuDevice(n->nc, &n->device) != ncclSuccess) {
        rc = mgcu_seterr(err, errlen, -EIO, "ncclCommCuDevice failed");
        goto fail_told;
    }
    if (CU_FAILED(&e, cudaSetDevice(n->device)) ||
        CU_FAILED(&e, cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking)) ||
        CU_FAILED(&e, cudaEventCreateWithFlags(&n->order, cudaEventDisableTiming)) ||
        queue_events(n, &e) || CU_FAILED(&e, cudaMalloc((void **)&n->zero, sizeof(float))) ||
        CU_FAILED(&e, cudaMemsetAsync(n->zero, 0, sizeof(float), n->stream))) {
        rc = mgcu_seterr(err, errlen, e.code, "%s", e.msg);
        goto fail_told;
    }
    rc = learn_layout(n, init_timeout);
    if (rc < 0) {
        mgcu_seterr(err, errlen, rc, "%s", n->c.errmsg);
        goto fail; /* mgcu_nccl_broken() told the store */
    }
    int v = 0;
    ncclGetVersion(&v);
    snprintf(n->c.desc, sizeof(n->c.desc), "nccl %d.%d.%d (%d rank%s on %d host%s)", v / 10000,
             v / 100 % 100, v % 100, world, world == 1 ? "" : "s", n->c.nhosts,
             n->c.nhosts == 1 ? "" : "s");
    *out = &n->c;
    return 0;

fail_told:
    /* the others stop waiting for this rank and name it */
    mgcu_nccl_key(n, k, sizeof(k), "fail", rank);
    mgcu_host->store_set(store, k, err ? err : "", err ? strlen(err) : 0, 0);
fail:
    if (n->nc) {
        ncclCommAbort(n->nc);
        n->nc = NULL;
    }
    destroy(n);
    return rc;
}
