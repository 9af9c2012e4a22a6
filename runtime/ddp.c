/* DDP: the trainer's hooks over a communicator (see ddp.h).
 *
 * The communication thread and backward share three counters under one
 * mutex: `launched` buckets may be averaged (backward has finished their
 * layers), `done` have been. Backward bumps `launched` from grad_ready; the
 * thread averages bucket `done` whenever done < launched; reduce_grads
 * launches whatever is left and waits for done == nbuckets.
 *
 * The gradient buffer is the communicator's registered memory (comm.h), lent
 * to the model at the start (once every rank is known to have built the same
 * model) and taken back at release: on one host the allreduces then sum the
 * ranks' gradients in place, in shared memory, with no staging copy. It is
 * `padded` floats long (the buckets' alignment, ddp.h); so are the
 * parameters' under ZeRO-1.
 *
 * ZeRO-1: bucket k of `count` floats is W chunks of count / W; rank r's
 * shard of it is chunk r (less any padding), and the optimizer state of the
 * shards of all buckets is kept back to back (shard_at[k]), so a rank holds
 * padded / W floats per state vector. For each bucket the thread
 * reduce-scatters the gradients in place (rank r's averaged chunk lands where
 * its chunk was), updates the shard (the optimizer and learning rate come
 * from begin_update, before any bucket of the step is launched) and
 * allgathers the parameters in place.
 *
 * On a device (CUDA) with a communicator on the device too (NCCL), each
 * bucket waits for an event, not for the host: grad_ready records one on the
 * compute stream once backward has queued the bucket's layers, and the
 * thread has the collective wait for it (mg_comm_wait_event) on the
 * communicator's own stream, so the allreduce overlaps the rest of backward,
 * as in PyTorch's DDP. The thread only queues each allreduce
 * (mg_comm_allreduce_queue) and goes on to the next bucket, so the buckets
 * follow one another on NCCL's stream with no host wait between them, in
 * bucket order on every rank; reduce_grads waits once for them all
 * (mg_comm_wait_queued, against the collective timeout) before the optimizer
 * is queued. ZeRO-1's buckets are still done one by one (the shard's update
 * sits between the reduce-scatter and the allgather). Such a communicator takes device memory only, so the
 * few host values DDP exchanges (model signatures, hashes, sums, rank
 * states) go through a device buffer (`stage`). The other way round, a
 * device model with a host communicator (MG_COMM=cpu on CUDA), the
 * gradients and parameters go through host memory (`host_buf`, registered)
 * after backward, without the thread. */
#include "ddp.h"
#include "progress.h"
#include "mg_err.h"
#include "rtutil.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct mg_ddp {
    struct mg_comm *comm;
    struct mg_model *m;
    int timeout_ms;
    float *reg_grads; /* registered memory lent to the model as its grad_buf */
    size_t align;     /* floats every bucket is a multiple of */
    size_t padded;    /* floats the buckets cover: nparams rounded up to align */
    int nb;
    struct mg_ddp_bucket b[MG_DDP_MAX_BUCKETS];
    /* ZeRO-1 */
    int zero;
    struct mg_ddp_bucket shard[MG_DDP_MAX_BUCKETS]; /* this rank's run of each bucket */
    size_t shard_at[MG_DDP_MAX_BUCKETS];            /* where its state starts */
    size_t shard_len;
    float *reg_params;    /* the same for its param_buf (ZeRO-1) */
    struct mg_optim *opt; /* from begin_update */
    double lr;
    char errmsg[MG_ERRMSG_LEN + 128];

    void *ev[MG_DDP_MAX_BUCKETS]; /* the event each launched bucket waits for (or NULL) */
    int dev_comm;                 /* the communicator takes device memory only */
    int host_comm;                /* the model is on a device, the communicator on the host */
    void *stage;                  /* dev_comm: device memory for host values */
    size_t stage_bytes;
    float *host_buf;         /* host_comm: the gradients and parameters on the host (registered) */
    char why[MG_ERRMSG_LEN]; /* a staging failure's message, for comm_failed */

    int threaded;
    int warm; /* a step has run: from the second on, buckets go during backward */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t work, finished;
    int launched, done, stop, err;
};

__attribute__((format(printf, 3, 4))) static int fail(struct mg_ddp *d, int code, const char *fmt,
                                                      ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->errmsg, sizeof(d->errmsg), fmt, ap);
    va_end(ap);
    return code;
}

static int comm_failed(struct mg_ddp *d, int rc)
{
    fail(d, rc, "%s", d->why[0] ? d->why : mg_comm_errmsg(d->comm));
    d->why[0] = '\0';
    return rc;
}

/* An allgather of host values. A communicator that takes device memory only
 * gets them through `stage`, this rank's block uploaded, all downloaded. */
static int gather(struct mg_ddp *d, const void *send, void *recv, size_t len)
{
    struct mg_comm *c = d->comm;
    struct mg_backend *be = d->m->be;
    size_t total = len * (size_t)c->world;
    d->why[0] = '\0';
    if (!d->dev_comm)
        return mg_comm_allgather(c, send, recv, len, d->timeout_ms);
    if (total > d->stage_bytes) {
        if (d->stage)
            be->ops->free(be, d->stage);
        d->stage = be->ops->alloc(be, total);
        d->stage_bytes = d->stage ? total : 0;
        if (!d->stage) {
            snprintf(d->why, sizeof(d->why), "out of device memory for a %zu-byte exchange", total);
            return -ENOMEM;
        }
    }
    char *mine = (char *)d->stage + (size_t)c->rank * len;
    be->ops->upload(be, mine, send, len);
    int rc = mg_comm_allgather(c, mine, d->stage, len, d->timeout_ms);
    if (rc)
        return rc;
    be->ops->download(be, recv, d->stage, total);
    rc = be->ops->sync(be);
    if (rc)
        snprintf(d->why, sizeof(d->why), "copying an exchange from the device: %s",
                 mg_backend_errmsg(be));
    return rc;
}

/* Rank 0's parameters to every rank; a device model with a host
 * communicator takes them through host_buf, registered memory allocated
 * here, the first time (a collective: every rank is here). */
static int broadcast(struct mg_ddp *d, float *param_buf, size_t count)
{
    struct mg_backend *be = d->m->be;
    size_t bytes = count * sizeof(float);
    int rc;
    d->why[0] = '\0';
    if (!d->host_comm)
        return mg_comm_broadcast(d->comm, param_buf, bytes, 0, d->timeout_ms);
    if (!d->host_buf && count) {
        void *p;
        rc = mg_comm_mem_alloc(d->comm, bytes, &p, d->timeout_ms);
        if (rc) {
            if (rc == -ENOMEM)
                snprintf(d->why, sizeof(d->why), "out of memory for the gradients");
            return rc;
        }
        d->host_buf = p;
    }
    be->ops->download(be, d->host_buf, param_buf, bytes);
    rc = be->ops->sync(be);
    if (!rc) {
        rc = mg_comm_broadcast(d->comm, d->host_buf, bytes, 0, d->timeout_ms);
        if (rc)
            return rc;
        be->ops->upload(be, param_buf, d->host_buf, bytes);
        rc = be->ops->sync(be);
    }
    if (rc)
        snprintf(d->why, sizeof(d->why), "copying the parameters to or from the device: %s",
                 mg_backend_errmsg(be));
    return rc;
}

/* A device model with a host communicator: every bucket averaged in host
 * memory after backward, then the gradients back on the device. */
static int reduce_on_host(struct mg_ddp *d)
{
    struct mg_model *m = d->m;
    struct mg_backend *be = m->be;
    size_t bytes = m->nparams * sizeof(float);
    be->ops->download(be, d->host_buf, m->grad_buf, bytes);
    int rc = be->ops->sync(be);
    for (int k = 0; k < d->nb && !rc; k++) {
        rc = mg_comm_allreduce(d->comm, d->host_buf + d->b[k].offset, d->b[k].count, MG_REDUCE_AVG,
                               d->timeout_ms);
        if (rc)
            return comm_failed(d, rc);
    }
    if (!rc) {
        be->ops->upload(be, m->grad_buf, d->host_buf, bytes);
        rc = be->ops->sync(be);
    }
    return rc ? fail(d, rc, "copying the gradients to or from the device: %s",
                     mg_backend_errmsg(be))
              : 0;
}

/* ---- buckets ------------------------------------------------------------------- */

/* Whole layers, from the last one back, until a bucket reaches its cap; then
 * each cut moves up to a multiple of the alignment (a bucket left empty
 * goes), and the first bucket ends at `padded`. A bucket is still complete
 * when backward has finished its layers: moving its start up only shrinks it. */
static int plan_buckets(const struct mg_model *m, size_t align, size_t cap_bytes,
                        size_t first_bytes, struct mg_ddp_bucket *b, size_t *padded)
{
    size_t cap = first_bytes / sizeof(float), start = m->nparams, end = m->nparams;
    int n = 0;
    *padded = (m->nparams + align - 1) / align * align;
    for (int i = m->nlayers - 1; i >= 0; i--) {
        const struct mg_layer *l = &m->layers[i];
        if (!l->param_count)
            continue;
        start = l->param_offset;
        if ((end - start >= cap || i == 0) && n < MG_DDP_MAX_BUCKETS - 1) {
            b[n++] = (struct mg_ddp_bucket){start, end - start};
            end = start;
            cap = cap_bytes / sizeof(float);
        }
    }
    if (end > 0) /* layers left over (or the bucket table full): one last bucket */
        b[n++] = (struct mg_ddp_bucket){0, end};
    if (n == 0 && m->nparams)
        b[n++] = (struct mg_ddp_bucket){0, m->nparams};
    int nb = 0;
    end = *padded;
    for (int k = 0; k < n; k++) {
        start = (b[k].offset + align - 1) / align * align;
        if (start >= end)
            continue;
        b[nb++] = (struct mg_ddp_bucket){start, end - start};
        end = start;
    }
    return nb;
}

/* ZeRO-1: rank's chunk of each bucket at world size world, less the
 * padding, and where its state goes; returns the shard's padded length. */
static size_t plan_shard(const struct mg_ddp_bucket *b, int nb, size_t n, int world, int rank,
                         struct mg_ddp_bucket *shard, size_t *shard_at)
{
    size_t at = 0;
    for (int k = 0; k < nb; k++) {
        size_t chunk = b[k].count / (size_t)world, from = b[k].offset + (size_t)rank * chunk;
        size_t to = from + chunk < n ? from + chunk : n;
        shard[k] = (struct mg_ddp_bucket){from, to > from ? to - from : 0};
        shard_at[k] = at;
        at += chunk;
    }
    return at;
}

/* The alignment of the buckets at world size world: only a buffer DDP
 * allocates has room for padding (on the CPU, and under ZeRO-1 on a device
 * too: the communicator's memory). */
static size_t align_for(const struct mg_ddp *d, int world)
{
    return world > 1 && (d->m->be->device == MG_DEVICE_CPU || d->zero) ? 16 * (size_t)world : 1;
}

/* The buckets' caps of these options. */
static void caps_of(const struct mg_ddp_opts *o, size_t *cap, size_t *first)
{
    *cap = o && o->bucket_cap ? o->bucket_cap : MG_DDP_DEFAULT_BUCKET_CAP;
    *first = o && o->first_bucket                 ? o->first_bucket
             : *cap < MG_DDP_DEFAULT_FIRST_BUCKET ? *cap
                                                  : MG_DDP_DEFAULT_FIRST_BUCKET;
}

/* The layout of rank's shard at world size world (this run's, or another's:
 * a snapshot's shard from before a node loss). ZeRO-1 pads at any world
 * size above 1 (align_for). */
static int shard_layout(const struct mg_model *m, const struct mg_ddp_opts *o, int world, int rank,
                        struct mg_ddp_bucket *runs, size_t *shard_at, size_t *len)
{
    struct mg_ddp_bucket b[MG_DDP_MAX_BUCKETS];
    size_t padded, cap, first;
    caps_of(o, &cap, &first);
    int nb = plan_buckets(m, world > 1 ? 16 * (size_t)world : 1, cap, first, b, &padded);
    *len = plan_shard(b, nb, m->nparams, world, rank, runs, shard_at);
    return nb;
}

size_t mg_ddp_shard_len_at(const struct mg_model *m, const struct mg_ddp_opts *o, int world)
{
    struct mg_ddp_bucket runs[MG_DDP_MAX_BUCKETS];
    size_t at[MG_DDP_MAX_BUCKETS], len = 0;
    if (world < 1)
        return 0;
    shard_layout(m, o, world, 0, runs, at, &len);
    return len;
}

int mg_ddp_unshard(const struct mg_model *m, const struct mg_ddp_opts *o, int world, int rank,
                   const float *shard, size_t shard_len, float *full, int nvec)
{
    struct mg_ddp_bucket runs[MG_DDP_MAX_BUCKETS];
    size_t at[MG_DDP_MAX_BUCKETS], len, n = m->nparams;
    if (world < 1 || rank < 0 || rank >= world)
        return -EINVAL;
    int nb = shard_layout(m, o, world, rank, runs, at, &len);
    if (len != shard_len)
        return -MG_EFORMAT;
    for (int v = 0; v < nvec; v++)
        for (int k = 0; k < nb; k++)
            memcpy(full + (size_t)v * n + runs[k].offset, shard + (size_t)v * len + at[k],
                   runs[k].count * sizeof(float));
    return 0;
}

/* Queued, not waited for (where the communicator can: NCCL): the next bucket
 * queues behind it as soon as backward has queued its layers; reduce_grads
 * waits for them all (wait_queued). */
static int reduce_bucket(struct mg_ddp *d, int k)
{
    const struct mg_ddp_bucket *b = &d->b[k];
    int rc = mg_comm_allreduce_queue(d->comm, d->m->grad_buf + b->offset, b->count, MG_REDUCE_AVG,
                                     d->timeout_ms);
    return rc ? comm_failed(d, rc) : 0;
}

/* The buckets queued this step are done (the communication thread is idle). */
static int buckets_done(struct mg_ddp *d, int rc)
{
    if (rc)
        return rc;
    rc = mg_comm_wait_queued(d->comm, d->timeout_ms);
    return rc ? comm_failed(d, rc) : 0;
}

/* ZeRO-1: reduce-scatter, update this rank's chunk, allgather (see the top). */
static int zero_bucket(struct mg_ddp *d, int k)
{
    struct mg_model *m = d->m;
    const struct mg_ddp_bucket *b = &d->b[k];
    size_t chunk = b->count / (size_t)d->comm->world;
    size_t mine = b->offset + (size_t)d->comm->rank * chunk;
    int rc = mg_comm_reduce_scatter(d->comm, m->grad_buf + b->offset, m->grad_buf + mine, chunk,
                                    MG_REDUCE_AVG, d->timeout_ms);
    if (rc)
        return comm_failed(d, rc);
    if (d->shard[k].count)
        mg_optim_update(d->opt, m->param_buf + mine, m->grad_buf + mine, d->shard_at[k],
                        d->shard[k].count, d->lr);
    rc = mg_comm_allgather(d->comm, m->param_buf + mine, m->param_buf + b->offset,
                           chunk * sizeof(float), d->timeout_ms);
    return rc ? comm_failed(d, rc) : 0;
}

static int do_bucket(struct mg_ddp *d, int k)
{
    mg_progress_next_bucket(k); /* the flight recorder names it */
    return d->zero ? zero_bucket(d, k) : reduce_bucket(d, k);
}

static void *comm_thread(void *arg)
{
    struct mg_ddp *d = arg;
    pthread_mutex_lock(&d->mu);
    for (;;) {
        while (d->done == d->launched && !d->stop)
            pthread_cond_wait(&d->work, &d->mu);
        if (d->stop)
            break;
        int k = d->done;
        int skip = d->err != 0; /* after a failure, only count the rest off */
        pthread_mutex_unlock(&d->mu);
        /* on the device, bucket k waits for backward's event of it, not the host */
        void *ev = d->ev[k];
        d->ev[k] = NULL;
        int rc = skip ? 0 : mg_comm_wait_event(d->comm, ev);
        rc = rc ? comm_failed(d, rc) : skip ? 0 : do_bucket(d, k);
        mg_backend_event_release(d->m->be, ev); /* the collective that waits on it is queued */
        pthread_mutex_lock(&d->mu);
        if (rc && !d->err)
            d->err = rc;
        d->done++;
        pthread_cond_signal(&d->finished);
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

/* ---- hooks ---------------------------------------------------------------------- */

static int hook_grad_ready(void *ctx, float *grad_buf, size_t offset, size_t count)
{
    struct mg_ddp *d = ctx;
    if (!d->threaded)
        return 0;
    /* The first step on a device sends nothing during backward: CUDA loads a
     * kernel's module at its first launch (lazy loading, the default since
     * 12.2) and waits for the device to drain meanwhile, which with NCCL
     * kernels spinning for their peers is a stall or, where NCCL's proxy
     * needs the context, a hang. So every cuBLAS and cuDNN kernel of forward
     * and backward is launched once before any collective; the sums, and so
     * the bits, are the same. (mg's own kernels load when the backend starts.) */
    if (!d->warm && d->m->be->device != MG_DEVICE_CPU)
        return 0;
    /* this thread alone moves `launched`: read without the lock */
    int n = d->launched;
    while (n < d->nb && d->b[n].offset >= offset)
        n++;
    for (int k = d->launched; k < n; k++)
        d->ev[k] = mg_backend_event_record(d->m->be); /* backward has queued bucket k */
    pthread_mutex_lock(&d->mu);
    if (n != d->launched) {
        d->launched = n;
        pthread_cond_signal(&d->work);
    }
    int err = d->err;
    pthread_mutex_unlock(&d->mu);
    return err;
}

static int hook_reduce_grads(void *ctx, float *grad_buf, size_t count)
{
    struct mg_ddp *d = ctx;
    int rc = 0;
    if (d->host_comm)
        return reduce_on_host(d);
    if (!d->threaded) {
        for (int k = 0; k < d->nb && !rc; k++)
            rc = do_bucket(d, k);
        return buckets_done(d, rc);
    }
    for (int k = d->launched; k < d->nb; k++)
        d->ev[k] = mg_backend_event_record(d->m->be);
    pthread_mutex_lock(&d->mu);
    if (d->launched != d->nb) {
        d->launched = d->nb;
        pthread_cond_signal(&d->work);
    }
    while (d->done != d->nb)
        pthread_cond_wait(&d->finished, &d->mu);
    rc = d->err;
    d->launched = d->done = 0;
    pthread_mutex_unlock(&d->mu);
    d->warm = 1;
    return buckets_done(d, rc);
}

/* What identifies a model's layout: tensor names and shapes. */
struct model_sig {
    uint64_t hash;
    uint64_t nparams;
    uint32_t ntensors;
    char name[MG_NAME_MAX];
};

static void model_signature(const struct mg_model *m, struct model_sig *s)
{
    unsigned char rec[MG_TENSOR_REC_BYTES];
    memset(s, 0, sizeof(*s));
    s->nparams = m->nparams;
    s->ntensors = (uint32_t)m->ntensors;
    snprintf(s->name, sizeof(s->name), "%s", m->name);
    uint64_t h = mg_hash64(m->name, strlen(m->name));
    for (int i = 0; i < m->ntensors; i++) {
        mg_model_tensor_record(&m->params[i], rec);
        h = h * 0x100000001b3ULL ^ mg_hash64(rec, sizeof(rec));
    }
    s->hash = h;
}

/* Allgathers one uint64 per rank; returns the first rank whose value differs
 * from rank 0's, -1 when all agree, or a negative code (< -1) on failure. */
static int first_differing(struct mg_ddp *d, uint64_t mine, uint64_t *all, int *rc_out)
{
    int rc = gather(d, &mine, all, sizeof(mine));
    *rc_out = rc;
    if (rc)
        return -1;
    for (int r = 1; r < d->comm->world; r++)
        if (all[r] != all[0])
            return r;
    return -1;
}

static int hook_broadcast_params(void *ctx, float *param_buf, size_t count)
{
    struct mg_ddp *d = ctx;
    struct mg_comm *c = d->comm;
    int world = c->world, rc;
    struct model_sig mine, *all = calloc((size_t)world, sizeof(*all));
    uint64_t *hashes = calloc((size_t)world, sizeof(uint64_t));
    if (!all || !hashes) {
        rc = fail(d, -ENOMEM, "out of memory");
        goto out;
    }
    model_signature(d->m, &mine);
    rc = gather(d, &mine, all, sizeof(mine));
    if (rc) {
        rc = comm_failed(d, rc);
        goto out;
    }
    for (int r = 1; r < world; r++)
        if (memcmp(&all[r], &all[0], sizeof(mine)) != 0) {
            all[r].name[MG_NAME_MAX - 1] = all[0].name[MG_NAME_MAX - 1] = '\0';
            rc = fail(d, -MG_ESHAPE,
                      "rank %d built a different model than rank 0: %s with %" PRIu64
                      " parameters in %u tensors (layout %016" PRIx64
                      "), rank 0 has %s with %" PRIu64 " in %u (layout %016" PRIx64 ")",
                      r, all[r].name, all[r].nparams, all[r].ntensors, all[r].hash, all[0].name,
                      all[0].nparams, all[0].ntensors, all[0].hash);
            goto out;
        }
    /* Same model everywhere: the gradients (and under ZeRO-1 the parameters)
     * can move to registered memory, `padded` floats (a collective, so only
     * now, or a different model would be reported as a registration of
     * another size). Device backends keep their own. */
    if (!d->reg_grads && d->m->nparams && (d->m->be->device == MG_DEVICE_CPU || d->zero)) {
        void *p;
        rc = mg_comm_mem_alloc(c, d->padded * sizeof(float), &p, d->timeout_ms);
        if (rc) {
            rc =
                rc == -ENOMEM ? fail(d, rc, "out of memory for the gradients") : comm_failed(d, rc);
            goto out;
        }
        d->reg_grads = p;
        /* the model's own buffer would only take room until release */
        d->m->be->ops->free(d->m->be, mg_model_swap_grad_buf(d->m, d->reg_grads));
    }
    if (d->zero && !d->reg_params && d->m->nparams) {
        void *p;
        rc = mg_comm_mem_alloc(c, d->padded * sizeof(float), &p, d->timeout_ms);
        if (rc) {
            rc = rc == -ENOMEM ? fail(d, rc, "out of memory for the parameters")
                               : comm_failed(d, rc);
            goto out;
        }
        d->reg_params = p;
        d->m->be->ops->free(d->m->be, mg_model_swap_param_buf(d->m, d->reg_params));
    }
    param_buf = d->m->param_buf;
    rc = broadcast(d, param_buf, count);
    if (rc) {
        rc = comm_failed(d, rc);
        goto out;
    }
    int bad = first_differing(d, mg_model_param_hash(d->m), hashes, &rc);
    if (rc) {
        rc = comm_failed(d, rc);
        goto out;
    }
    if (bad > 0)
        rc = fail(d, -MG_EDIVERGED,
                  "after the broadcast from rank 0, rank %d's parameters hash to %016" PRIx64
                  ", rank 0's to %016" PRIx64,
                  bad, hashes[bad], hashes[0]);
out:
    free(all);
    free(hashes);
    return rc;
}

/* Sums in double, in rank order: the same figures on every rank. */
static int hook_reduce_sums(void *ctx, double *sums, int n)
{
    struct mg_ddp *d = ctx;
    int world = d->comm->world;
    double *all = calloc((size_t)world * (size_t)n + 1, sizeof(double));
    if (!all)
        return fail(d, -ENOMEM, "out of memory");
    int rc = gather(d, sums, all, (size_t)n * sizeof(double));
    if (rc) {
        free(all);
        return comm_failed(d, rc);
    }
    for (int i = 0; i < n; i++) {
        double s = 0;
        for (int r = 0; r < world; r++)
            s += all[(size_t)r * (size_t)n + (size_t)i];
        sums[i] = s;
    }
    free(all);
    return 0;
}

/* ---- ZeRO-1 hooks ------------------------------------------------------------------ */

static int hook_begin_update(void *ctx, struct mg_optim *opt, double lr)
{
    struct mg_ddp *d = ctx;
    if (opt->n != d->shard_len)
        return fail(d, -EINVAL, "the optimizer keeps state for %zu parameters, the shard has %zu",
                    opt->n, d->shard_len);
    d->opt = opt;
    d->lr = lr;
    return 0;
}

/* Each bucket's chunks allgathered straight to where they belong in a
 * vector of the padded length (they are its consecutive chunks), then the
 * vectors closed up to nparams floats each: no room beyond full's. */
static int hook_gather_state(void *ctx, const float *shard, float *full, int nvec)
{
    struct mg_ddp *d = ctx;
    struct mg_backend *be = d->m->be;
    size_t world = (size_t)d->comm->world, len = d->shard_len, n = d->m->nparams;
    size_t padded = len * world;
    /* on a device the shard is device memory, and so must the result be (NCCL's): gathered
     * there, then downloaded into full */
    int staged = be->device != MG_DEVICE_CPU && nvec > 0;
    float *to = staged ? be->ops->alloc(be, (size_t)nvec * padded * sizeof(float)) : full;
    if (!to)
        return fail(d, -ENOMEM, "out of device memory to gather the optimizer state");
    for (int v = 0; v < nvec; v++)
        for (int k = 0; k < d->nb; k++) {
            size_t chunk = d->b[k].count / world;
            int rc = mg_comm_allgather(d->comm, shard + (size_t)v * len + d->shard_at[k],
                                       to + (size_t)v * padded + d->b[k].offset,
                                       chunk * sizeof(float), d->timeout_ms);
            if (rc) {
                if (staged)
                    be->ops->free(be, to);
                return comm_failed(d, rc);
            }
        }
    if (staged) {
        be->ops->download(be, full, to, (size_t)nvec * padded * sizeof(float));
        int rc = be->ops->sync(be);
        be->ops->free(be, to);
        if (rc)
            return fail(d, rc, "downloading the gathered optimizer state: %s",
                        mg_backend_errmsg(be));
    }
    for (int v = 1; v < nvec; v++)
        memmove(full + (size_t)v * n, full + (size_t)v * padded, n * sizeof(float));
    return 0;
}

static void hook_shard_state(void *ctx, const float *full, float *shard, int nvec)
{
    struct mg_ddp *d = ctx;
    struct mg_backend *be = d->m->be;
    size_t world = (size_t)d->comm->world, len = d->shard_len, n = d->m->nparams;
    /* on a device the shard is device memory: made on the host, then uploaded */
    int staged = be->device != MG_DEVICE_CPU && nvec > 0;
    float *to = staged ? malloc((size_t)nvec * len * sizeof(float)) : shard;
    if (!to) {
        fail(d, -ENOMEM, "out of memory to shard the optimizer state");
        return;
    }
    for (int v = 0; v < nvec; v++)
        for (int k = 0; k < d->nb; k++) {
            float *out = to + (size_t)v * len + d->shard_at[k];
            memset(out, 0, d->b[k].count / world * sizeof(float));
            memcpy(out, full + (size_t)v * n + d->shard[k].offset,
                   d->shard[k].count * sizeof(float));
        }
    if (staged) {
        be->ops->upload(be, shard, to, (size_t)nvec * len * sizeof(float));
        free(to);
    }
}

void mg_ddp_hooks(struct mg_ddp *d, struct mg_train_hooks *hooks)
{
    *hooks = (struct mg_train_hooks){
        .ctx = d,
        .grad_ready = hook_grad_ready,
        .reduce_grads = hook_reduce_grads,
        .broadcast_params = hook_broadcast_params,
        .reduce_sums = hook_reduce_sums,
    };
    if (d->zero) {
        hooks->shard_len = d->shard_len;
        hooks->begin_update = hook_begin_update;
        hooks->gather_state = hook_gather_state;
        hooks->shard_state = hook_shard_state;
    }
}

/* ---- checks ---------------------------------------------------------------------- */

int mg_ddp_check_replicas(struct mg_ddp *d, long step)
{
    uint64_t *all = calloc((size_t)d->comm->world, sizeof(uint64_t));
    int rc;
    if (!all)
        return fail(d, -ENOMEM, "out of memory");
    int bad = first_differing(d, mg_model_param_hash(d->m), all, &rc);
    if (rc)
        rc = comm_failed(d, rc);
    else if (bad > 0)
        rc = fail(d, -MG_EDIVERGED,
                  "replicas diverged at step %ld: rank %d's parameters hash to %016" PRIx64
                  ", rank 0's to %016" PRIx64 " (this rank computes on %s)",
                  step, bad, all[bad], all[0], d->m->be->name ? d->m->be->name : "?");
    free(all);
    return rc;
}

int mg_ddp_gather_rank_states(struct mg_ddp *d, const struct mg_rank_state *mine,
                              struct mg_rank_state *all)
{
    int world = d->comm->world;
    unsigned char packed[MG_RANK_STATE_BYTES];
    unsigned char *buf = malloc((size_t)world * MG_RANK_STATE_BYTES);
    if (!buf)
        return fail(d, -ENOMEM, "out of memory");
    mg_rank_state_pack(mine, packed);
    int rc = gather(d, packed, buf, MG_RANK_STATE_BYTES);
    if (rc) {
        rc = comm_failed(d, rc);
    } else {
        for (int r = 0; r < world && !rc; r++) {
            rc = mg_rank_state_unpack(buf + (size_t)r * MG_RANK_STATE_BYTES, MG_RANK_STATE_BYTES,
                                      &all[r]);
            if (!rc && all[r].rank != (uint32_t)r)
                rc = fail(d, -MG_EPROTO, "rank %d sent the state of rank %u", r, all[r].rank);
        }
    }
    free(buf);
    return rc;
}

int mg_ddp_check_resume(struct mg_ddp *d, const struct mg_trainer *t)
{
    struct mg_model *m = d->m;
    int world = d->comm->world, rc = 0;
    /* a shard is not comparable: the whole state each rank read from its file */
    size_t nstate = d->zero ? 0 : t->opt.state_count;
    float *host = malloc((nstate ? nstate : 1) * sizeof(float));
    uint64_t mine[5], *all = calloc((size_t)world * 5, sizeof(uint64_t));
    if (!host || !all) {
        rc = fail(d, -ENOMEM, "out of memory");
        goto out;
    }
    if (nstate) {
        m->be->ops->download(m->be, host, t->opt.state, nstate * sizeof(float));
        rc = m->be->ops->sync(m->be);
        if (rc)
            goto out;
    }
    mine[0] = (uint64_t)t->step;
    mine[1] = (uint64_t)t->epoch;
    mine[2] = (uint64_t)t->batch_in_epoch;
    mine[3] = mg_model_param_hash(m);
    mine[4] = d->zero ? t->resumed.state_hash : mg_hash64(host, nstate * sizeof(float));
    rc = gather(d, mine, all, sizeof(mine));
    if (rc) {
        rc = comm_failed(d, rc);
        goto out;
    }
    for (int r = 1; r < world; r++) {
        const uint64_t *o = all + (size_t)r * 5;
        if (o[0] != all[0] || o[1] != all[1] || o[2] != all[2]) {
            rc = fail(d, -MG_ECONFIG,
                      "rank %d resumed at step %" PRIu64 " (epoch %" PRIu64 ", batch %" PRIu64
                      ") but rank 0 at step %" PRIu64 " (epoch %" PRIu64 ", batch %" PRIu64
                      "): every rank must see the same checkpoint directory",
                      r, o[0], o[1], o[2], all[0], all[1], all[2]);
            goto out;
        }
        if (o[3] != all[3] || o[4] != all[4]) {
            rc = fail(d, -MG_ECONFIG,
                      "rank %d resumed step %" PRIu64 " with different %s than rank 0: "
                      "every rank must see the same checkpoint files",
                      r, o[0], o[3] != all[3] ? "parameters" : "optimizer state");
            goto out;
        }
    }
out:
    free(host);
    free(all);
    return rc;
}

int mg_ddp_barrier(struct mg_ddp *d)
{
    int rc = mg_comm_barrier(d->comm, d->timeout_ms);
    return rc ? comm_failed(d, rc) : 0;
}

int mg_ddp_allgather(struct mg_ddp *d, const void *send, void *recv, size_t len)
{
    int rc = gather(d, send, recv, len);
    return rc ? comm_failed(d, rc) : 0;
}

int mg_ddp_broadcast_bytes(struct mg_ddp *d, void *buf, size_t len, int root)
{
    struct mg_comm *c = d->comm;
    struct mg_backend *be = d->m->be;
    int rc;
    d->why[0] = '\0';
    if (!d->dev_comm) {
        rc = mg_comm_broadcast(c, buf, len, root, d->timeout_ms);
        return rc ? comm_failed(d, rc) : 0;
    }
    /* a communicator of device memory only (NCCL): through `stage`, as gather's */
    if (len > d->stage_bytes) {
        if (d->stage)
            be->ops->free(be, d->stage);
        d->stage = be->ops->alloc(be, len);
        d->stage_bytes = d->stage ? len : 0;
        if (!d->stage) {
            snprintf(d->why, sizeof(d->why), "out of device memory for a %zu-byte broadcast", len);
            return comm_failed(d, -ENOMEM);
        }
    }
    if (c->rank == root)
        be->ops->upload(be, d->stage, buf, len);
    rc = mg_comm_broadcast(c, d->stage, len, root, d->timeout_ms);
    if (rc)
        return comm_failed(d, rc);
    be->ops->download(be, buf, d->stage, len);
    rc = be->ops->sync(be);
    if (rc) {
        snprintf(d->why, sizeof(d->why), "copying a broadcast from the device: %s",
                 mg_backend_errmsg(be));
        return comm_failed(d, rc);
    }
    return 0;
}

const char *mg_ddp_errmsg(const struct mg_ddp *d)
{
    return d ? d->errmsg : "";
}

int mg_ddp_buckets(const struct mg_ddp *d, const struct mg_ddp_bucket **buckets)
{
    *buckets = d->b;
    return d->nb;
}

size_t mg_ddp_padded_len(const struct mg_ddp *d)
{
    return d->padded;
}

int mg_ddp_shard(const struct mg_ddp *d, const struct mg_ddp_bucket **runs, size_t *len)
{
    *runs = d->shard;
    *len = d->shard_len;
    return d->zero ? d->nb : 0;
}

/* ---- lifetime --------------------------------------------------------------------- */

int mg_ddp_create(struct mg_ddp **out, struct mg_comm *comm, struct mg_model *m,
                  const struct mg_ddp_opts *opts, char *err, size_t errlen)
{
    struct mg_ddp_opts o = opts ? *opts : (struct mg_ddp_opts){0};
    struct mg_ddp *d = calloc(1, sizeof(*d));
    if (!d)
        return mg_seterr(err, errlen, -ENOMEM, "out of memory");
    d->comm = comm;
    d->m = m;
    d->timeout_ms = o.timeout_ms > 0 ? o.timeout_ms : MG_COMM_DEFAULT_TIMEOUT;
    d->zero = o.zero;
    if (d->zero && m->be->device != MG_DEVICE_CPU && !comm->device_memory) {
        free(d);
        return mg_seterr(err, errlen, -MG_EUNSUPPORTED,
                         "ZeRO-1 (--zero 1) on a GPU needs a communicator on the GPU (NCCL: "
                         "MG_COMM=auto or nccl); the %s communicator averages through host memory",
                         comm->ops->name);
    }
    size_t cap, first;
    d->align = align_for(d, comm->world);
    caps_of(&o, &cap, &first);
    d->nb = plan_buckets(m, d->align, cap, first, d->b, &d->padded);
    if (d->zero)
        d->shard_len =
            plan_shard(d->b, d->nb, m->nparams, comm->world, comm->rank, d->shard, d->shard_at);
    d->dev_comm = comm->device_memory;
    d->host_comm = !comm->device_memory && m->be->device != MG_DEVICE_CPU;
    if (d->dev_comm && m->be->device == MG_DEVICE_CPU) {
        free(d);
        return mg_seterr(err, errlen, -MG_ECONFIG,
                         "the %s communicator reduces device memory, and the model is on the CPU",
                         comm->ops->name);
    }
    /* One rank has nobody to talk to; one bucket has nothing to overlap;
     * gradients copied to the host after backward have nothing either. */
    d->threaded = !o.no_thread && (comm->world > 1 || o.force_thread) && d->nb > 1 && !d->host_comm;
    if (d->threaded) {
        int rc = pthread_mutex_init(&d->mu, NULL);
        if (!rc)
            rc = pthread_cond_init(&d->work, NULL);
        if (!rc)
            rc = pthread_cond_init(&d->finished, NULL);
        if (!rc)
            rc = pthread_create(&d->thread, NULL, comm_thread, d);
        if (rc) {
            free(d);
            return mg_seterr(err, errlen, -rc, "cannot start the communication thread: %s",
                             strerror(rc));
        }
    }
    *out = d;
    return 0;
}

/* Out of memory giving the model a buffer back: it has none (its release
 * accepts that), rather than one its backend would free wrongly. */
static void forget_buf(struct mg_model *m, int params)
{
    if (params)
        m->param_buf = NULL;
    else
        m->grad_buf = NULL;
    for (int t = 0; t < m->ntensors; t++)
        (params ? m->params : m->grads)[t].data = NULL;
}

void mg_ddp_release(struct mg_ddp *d)
{
    if (!d)
        return;
    if (d->threaded) {
        pthread_mutex_lock(&d->mu);
        d->stop = 1;
        pthread_cond_signal(&d->work);
        pthread_mutex_unlock(&d->mu);
        pthread_join(d->thread, NULL);
        pthread_cond_destroy(&d->work);
        pthread_cond_destroy(&d->finished);
        pthread_mutex_destroy(&d->mu);
    }
    struct mg_model *m = d->m;
    size_t bytes = m->nparams * sizeof(float);
    if (d->reg_grads) {
        float *mine = m->be->ops->alloc(m->be, bytes);
        if (mine)
            mg_model_swap_grad_buf(m, mine);
        else
            forget_buf(m, 0);
        mg_comm_mem_free(d->comm, d->reg_grads);
    }
    if (d->reg_params) { /* the model keeps the trained parameters */
        float *mine = m->be->ops->alloc(m->be, bytes);
        if (mine)
            mg_model_swap_param_buf(m, mine);
        else
            forget_buf(m, 1);
        mg_comm_mem_free(d->comm, d->reg_params);
    }
    for (int k = 0; k < MG_DDP_MAX_BUCKETS; k++)
        mg_backend_event_release(d->m->be, d->ev[k]); /* of a step that failed */
    if (d->stage)
        d->m->be->ops->free(d->m->be, d->stage);
    mg_comm_mem_free(d->comm, d->host_buf);
    free(d);
}
