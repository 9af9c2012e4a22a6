/* The backend-independent part of the communication interface: which
 * communicator a job gets (mg_comm_create), the options read from the
 * environment (MG_COMM, MG_COMM_TIMEOUT, ...), argument checks and the broken
 * state around every collective, and operation descriptions for messages.
 * The backends: comm_single.c (world size 1), comm_cpu*.c, NCCL in the CUDA
 * plugin. */
#include "comm.h"
#include "comm_internal.h"
#include "mg_err.h"
#include "progress.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int mg_comm_mode_parse(const char *text, enum mg_comm_mode *mode)
{
    if (!text || !*text || strcmp(text, "auto") == 0)
        *mode = MG_COMM_AUTO;
    else if (strcmp(text, "shm") == 0)
        *mode = MG_COMM_SHM;
    else if (strcmp(text, "tcp") == 0)
        *mode = MG_COMM_TCP;
    else if (strcmp(text, "cpu") == 0)
        *mode = MG_COMM_CPU;
    else if (strcmp(text, "nccl") == 0)
        *mode = MG_COMM_NCCL;
    else
        return -EINVAL;
    return 0;
}

const char *mg_comm_mode_name(enum mg_comm_mode mode)
{
    switch (mode) {
    case MG_COMM_SHM:
        return "shm";
    case MG_COMM_TCP:
        return "tcp";
    case MG_COMM_CPU:
        return "cpu";
    case MG_COMM_NCCL:
        return "nccl";
    default:
        return "auto";
    }
}

int mg_comm_create(struct mg_comm **out, struct mg_store *store, const struct mg_comm_opts *opts,
                   char *err, size_t errlen)
{
    if (opts->mode == MG_COMM_NCCL || (opts->mode == MG_COMM_AUTO && opts->on_cuda))
        return mg_comm_nccl_create(out, store, opts, err, errlen);
    return mg_comm_cpu_create(out, store, opts, err, errlen);
}

/* Seconds (may be fractional, > 0) to milliseconds. */
static int parse_seconds(const char *text, int *ms)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || end == text || *end || !(v > 0) || v > 86400.0 * 365)
        return -EINVAL;
    *ms = (int)ceil(v * 1000);
    return 0;
}

int mg_comm_opts_from_env(struct mg_comm_opts *opts, char *err, size_t errlen)
{
    const char *v;
    if ((v = getenv("MG_COMM")) && mg_comm_mode_parse(v, &opts->mode)) {
        return mg_seterr(err, errlen, -EINVAL, "MG_COMM='%s': expected auto, cpu, shm, tcp or nccl",
                         v);
    }
    static const char *const timeouts[] = {"MG_COMM_TIMEOUT", "MG_COMM_INIT_TIMEOUT"};
    int *timeout_ms[] = {&opts->timeout_ms, &opts->init_timeout_ms};
    for (int i = 0; i < 2; i++)
        if ((v = getenv(timeouts[i])) && *v && parse_seconds(v, timeout_ms[i])) {
            return mg_seterr(err, errlen, -EINVAL, "%s='%.32s': expected a number of seconds > 0",
                             timeouts[i], v);
        }
    if ((v = getenv("MG_COMM_SPIN_US")) && *v) {
        char *end;
        errno = 0;
        long x = strtol(v, &end, 10);
        if (errno || end == v || *end || x < 0 || x > 1000000) {
            return mg_seterr(err, errlen, -EINVAL,
                             "MG_COMM_SPIN_US='%s': expected microseconds from 0 to 1000000", v);
        }
        opts->spin_us = x ? (int)x : -1;
    }
    if ((v = getenv("MG_COMM_TCP_SEGMENT")) && *v) {
        char *end;
        errno = 0;
        unsigned long long x = strtoull(v, &end, 10);
        if (errno || end == v || *end || x < 4096 || x > (64ull << 20)) {
            return mg_seterr(err, errlen, -EINVAL,
                             "MG_COMM_TCP_SEGMENT='%s': expected bytes from 4096 to 67108864", v);
        }
        opts->tcp_segment = (size_t)x;
    }
    if ((v = getenv("MG_COMM_ZEROCOPY")) && *v) {
        if (strcmp(v, "0") && strcmp(v, "1")) {
            return mg_seterr(err, errlen, -EINVAL, "MG_COMM_ZEROCOPY='%s': expected 0 or 1", v);
        }
        opts->no_zerocopy = *v == '0';
    }
    if ((v = getenv("MG_COMM_HOST")) && *v)
        opts->host_id = v;
    if ((v = getenv("MG_COMM_ADDR")) && *v)
        opts->advertise = v;
    return 0;
}

/* ---- operation descriptions and faults ------------------------------------------ */

void mg_opdesc_text(const struct mg_opdesc *d, char *buf, size_t len)
{
    unsigned long long n = (unsigned long long)d->len;
    switch (d->kind) {
    case MG_OP_ALLREDUCE_SUM:
    case MG_OP_ALLREDUCE_AVG:
        snprintf(buf, len, "allreduce%s of %llu float%s",
                 d->kind == MG_OP_ALLREDUCE_AVG ? " (avg)" : "", n / 4, n / 4 == 1 ? "" : "s");
        break;
    case MG_OP_REDUCE_SCATTER_SUM:
    case MG_OP_REDUCE_SCATTER_AVG:
        snprintf(buf, len, "reduce-scatter%s of %llu float%s per rank",
                 d->kind == MG_OP_REDUCE_SCATTER_AVG ? " (avg)" : "", n / 4, n / 4 == 1 ? "" : "s");
        break;
    case MG_OP_BROADCAST:
        snprintf(buf, len, "broadcast of %llu byte%s from rank %d", n, n == 1 ? "" : "s",
                 (int)d->root);
        break;
    case MG_OP_ALLGATHER:
        snprintf(buf, len, "allgather of %llu byte%s per rank", n, n == 1 ? "" : "s");
        break;
    case MG_OP_SHIFT:
        snprintf(buf, len, "shift of %llu byte%s per rank by %d", n, n == 1 ? "" : "s",
                 (int)d->root);
        break;
    case MG_OP_BARRIER:
        snprintf(buf, len, "barrier");
        break;
    case MG_OP_SETUP:
        snprintf(buf, len, "communicator setup");
        break;
    case MG_OP_REGISTER:
        snprintf(buf, len, "registration of %llu byte%s", n, n == 1 ? "" : "s");
        break;
    default:
        snprintf(buf, len, "unknown operation %u", (unsigned)d->kind);
        break;
    }
}

int mg_opdesc_equal(const struct mg_opdesc *a, const struct mg_opdesc *b)
{
    return a->kind == b->kind && a->root == b->root && a->len == b->len;
}

int mg_fault_code(const struct mg_fault *f)
{
    switch (f->kind) {
    case MG_FAULT_TIMEOUT:
        return -ETIMEDOUT;
    case MG_FAULT_DIED:
    case MG_FAULT_CLOSED:
        return -MG_EPEER;
    case MG_FAULT_MISMATCH:
        return -MG_EPROTO;
    case MG_FAULT_ABORTED: {
        struct mg_fault o = {.kind = f->orig_kind, .err = f->err};
        return o.kind == MG_FAULT_ABORTED ? -MG_EPEER : mg_fault_code(&o);
    }
    default:
        return f->err ? f->err : -EIO;
    }
}

/* ---- wrappers ------------------------------------------------------------------- */

static int resolve_timeout(const struct mg_comm *c, int timeout_ms)
{
    if (timeout_ms == MG_COMM_DEFAULT_TIMEOUT || timeout_ms == 0)
        return c->timeout_ms > 0 ? c->timeout_ms : MG_COMM_TIMEOUT_DEFAULT_MS;
    return timeout_ms;
}

static int precheck(struct mg_comm *c)
{
    if (!c)
        return -EINVAL;
    if (c->failed)
        return c->failed_code ? c->failed_code : -MG_EPEER;
    return 0;
}

/* An allreduce, done now or queued (queue: the backend's allreduce_queue):
 * the same checks, and the flight recorder sees the host's part (for a
 * queued one, queueing it). */
static int allreduce_call(struct mg_comm *c, int queue, float *buf, size_t count,
                          enum mg_reduce_op op, int timeout_ms)
{
    int rc = precheck(c);
    if (rc)
        return rc;
    if ((count && !buf) || count > SIZE_MAX / sizeof(float) / 2 ||
        (op != MG_REDUCE_SUM && op != MG_REDUCE_AVG))
        return -EINVAL;
    uint64_t seq = mg_progress_coll_begin(MG_PROG_ALLREDUCE, count * sizeof(float));
    int t = resolve_timeout(c, timeout_ms);
    rc = queue ? c->ops->allreduce_queue(c, buf, count, op, t)
               : c->ops->allreduce(c, buf, count, op, t);
    mg_progress_coll_end(seq, rc);
    return rc;
}

int mg_comm_allreduce(struct mg_comm *c, float *buf, size_t count, enum mg_reduce_op op,
                      int timeout_ms)
{
    return allreduce_call(c, 0, buf, count, op, timeout_ms);
}

/* A backend without a queue does it now. */
int mg_comm_allreduce_queue(struct mg_comm *c, float *buf, size_t count, enum mg_reduce_op op,
                            int timeout_ms)
{
    return allreduce_call(c, c && c->ops->allreduce_queue, buf, count, op, timeout_ms);
}

int mg_comm_wait_queued(struct mg_comm *c, int timeout_ms)
{
    int rc = precheck(c);
    if (rc || !c->ops->wait_queued)
        return rc;
    uint64_t seq = mg_progress_coll_begin(MG_PROG_ALLREDUCE, 0);
    rc = c->ops->wait_queued(c, resolve_timeout(c, timeout_ms));
    mg_progress_coll_end(seq, rc);
    return rc;
}

int mg_comm_broadcast(struct mg_comm *c, void *buf, size_t len, int root, int timeout_ms)
{
    int rc = precheck(c);
    if (rc)
        return rc;
    if ((len && !buf) || root < 0 || root >= c->world || len > SIZE_MAX / 2)
        return -EINVAL;
    uint64_t seq = mg_progress_coll_begin(MG_PROG_BROADCAST, len);
    rc = c->ops->broadcast(c, buf, len, root, resolve_timeout(c, timeout_ms));
    mg_progress_coll_end(seq, rc);
    return rc;
}

int mg_comm_allgather(struct mg_comm *c, const void *send, void *recv, size_t len, int timeout_ms)
{
    int rc = precheck(c);
    if (rc)
        return rc;
    if ((len && (!send || !recv)) || len > SIZE_MAX / 2 / (size_t)c->world)
        return -EINVAL;
    uint64_t seq = mg_progress_coll_begin(MG_PROG_ALLGATHER, len * (size_t)c->world);
    rc = c->ops->allgather(c, send, recv, len, resolve_timeout(c, timeout_ms));
    mg_progress_coll_end(seq, rc);
    return rc;
}

int mg_comm_shift(struct mg_comm *c, const void *send, void *recv, size_t len, int k,
                  int timeout_ms)
{
    int rc = precheck(c);
    if (rc)
        return rc;
    if ((len && (!send || !recv)) || len > SIZE_MAX / 2)
        return -EINVAL;
    uintptr_t s0 = (uintptr_t)send, r0 = (uintptr_t)recv;
    if (len && s0 < r0 + len && r0 < s0 + len)
        return -EINVAL;
    k %= c->world;
    if (k < 0)
        k += c->world;
    if (k == 0) {
        if (len)
            memcpy(recv, send, len);
        return 0;
    }
    if (!c->ops->shift)
        return -MG_EUNSUPPORTED;
    uint64_t seq = mg_progress_coll_begin(MG_PROG_SHIFT, len);
    rc = c->ops->shift(c, send, recv, len, k, resolve_timeout(c, timeout_ms));
    mg_progress_coll_end(seq, rc);
    return rc;
}

int mg_comm_has_shift(const struct mg_comm *c)
{
    return c && (c->world == 1 || c->ops->shift);
}

int mg_comm_reduce_scatter(struct mg_comm *c, const float *send, float *recv, size_t recv_count,
                           enum mg_reduce_op op, int timeout_ms)
{
    int rc = precheck(c);
    if (rc)
        return rc;
    if ((recv_count && (!send || !recv)) ||
        recv_count > SIZE_MAX / sizeof(float) / 2 / (size_t)c->world ||
        (op != MG_REDUCE_SUM && op != MG_REDUCE_AVG))
        return -EINVAL;
    /* in place, or apart */
    uintptr_t s0 = (uintptr_t)send, s1 = s0 + (size_t)c->world * recv_count * sizeof(float);
    uintptr_t r0 = (uintptr_t)recv, r1 = r0 + recv_count * sizeof(float);
    if (recv_count && r0 != s0 + (size_t)c->rank * recv_count * sizeof(float) && r1 > s0 && r0 < s1)
        return -EINVAL;
    if (!c->ops->reduce_scatter)
        return -MG_EUNSUPPORTED;
    uint64_t seq = mg_progress_coll_begin(MG_PROG_REDUCE_SCATTER,
                                          recv_count * sizeof(float) * (size_t)c->world);
    rc = c->ops->reduce_scatter(c, send, recv, recv_count, op, resolve_timeout(c, timeout_ms));
    mg_progress_coll_end(seq, rc);
    return rc;
}

int mg_comm_wait_event(struct mg_comm *c, void *event)
{
    int rc = precheck(c);
    if (rc)
        return rc;
    if (!event || !c->ops->wait_event)
        return 0;
    return c->ops->wait_event(c, event);
}

int mg_comm_barrier(struct mg_comm *c, int timeout_ms)
{
    int rc = precheck(c);
    if (rc)
        return rc;
    uint64_t seq = mg_progress_coll_begin(MG_PROG_BARRIER, 0);
    rc = c->ops->barrier(c, resolve_timeout(c, timeout_ms));
    mg_progress_coll_end(seq, rc);
    return rc;
}

int mg_comm_mem_alloc(struct mg_comm *c, size_t bytes, void **out, int timeout_ms)
{
    int rc = precheck(c);
    if (rc)
        return rc;
    if (!out || !bytes || bytes > SIZE_MAX / 4)
        return -EINVAL;
    *out = NULL;
    return c->ops->mem_alloc(c, bytes, out, resolve_timeout(c, timeout_ms));
}

void mg_comm_mem_free(struct mg_comm *c, void *p)
{
    if (c && p)
        c->ops->mem_free(c, p);
}

/* Ordinary memory with mem_alloc's promises, for backends without registration. */
void *mg_comm_plain_alloc(size_t bytes)
{
    size_t len = (bytes + 4095) / 4096 * 4096;
    void *p = aligned_alloc(4096, len);
    if (p)
        memset(p, 0, len);
    return p;
}

void mg_comm_release(struct mg_comm *c)
{
    if (c)
        c->ops->release(c);
}

const char *mg_comm_errmsg(const struct mg_comm *c)
{
    return c ? c->errmsg : "";
}
