/* The trainer's batches and DDP as they drive a GPU, checked without one: the
 * CPU backend behind a wrapper that says it is a device and keeps the overlap
 * ops (page-locked host memory, upload_async / upload_wait, events) in a
 * ledger, and a communicator that, like NCCL, takes only the backend's
 * memory and orders a collective after wait_event's event. The ledger shows
 * what a GPU would be asked to do, and in which order:
 * - every micro-batch holds the samples the sampler names for it (over
 *   epochs, an evaluation and a resume), copied from page-locked memory by
 *   upload_async, waited for (upload_wait) before its forward, and the next
 *   one queued while this one computes (before its loss is read back);
 * - DDP records one event per bucket, after backward has queued the bucket's
 *   layers, has each bucket's allreduce wait for its own event, returns every
 *   event once its allreduce is queued, and exchanges host values (model
 *   signature, hashes, sums, rank states) through device memory; the
 *   parameters end bit-identical to plain CPU DDP;
 * - a device model with a host communicator (MG_COMM=cpu on CUDA) averages
 *   through host memory after backward, to the same bits;
 * - one rank with the communication thread forced (MG_TEST_COMM_THREAD) runs
 *   the same overlap, to the bits of a run without DDP.
 * What the GPU does with these calls is the GPU suite's (tests/gpu/).
 * timeout: 120 */
#include "tap.h"
#include "comm_internal.h"
#include "ddp.h"
#include "mg_err.h"
#include "models.h"
#include "net.h"
#include "sampler.h"
#include "shm_comm.h"
#include "trainer.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define BATCH  16
#define EVENTS 64

/* ---- the device: the CPU backend, with a ledger --------------------------------------- */

struct region {
    const char *p;
    size_t n;
};

static struct {
    struct mg_backend be; /* the CPU backend's fields, this file's ops */
    struct mg_backend *cpu;
    struct mg_backend_ops ops;
    struct region dev[64], pin[8];
    /* uploads: the last one into each device buffer (its ticket, or 0 for a
     * synchronous one: evaluation's) */
    uint64_t tickets, waited;
    struct {
        const void *dst;
        uint64_t ticket;
    } last[16];
    int bad_upload;           /* upload_async not from page-locked memory into device memory */
    int bad_order;            /* a forward or loss read a batch before its upload was waited for */
    int sync_uploads;         /* upload() calls (evaluation, checkpoints) */
    int forwards, prefetched; /* micro-batches; those whose successor was queued before the loss */
    uint64_t at_forward;      /* tickets when the current micro-batch's forward began */
    /* events */
    int tok[EVENTS], used[EVENTS], recorded, released, bad_release;
    int forwards_loss; /* training loss computations */
    /* events recorded while backward still had layers to queue, in a run's
     * first training step and after it (the tests set training_steps) */
    int early[2], training_steps;
    size_t queued_from[EVENTS]; /* the lowest gradient backward had queued when recorded */
    /* what backward has queued since the forward: the lowest gradient offset */
    const struct mg_model *model;
    size_t lowest;
    /* labels of each micro-batch, in order */
    int nseen;
    int32_t seen[64][BATCH];
    int seen_n[64];
    /* waits: sync() and download() calls (a download waits for the device) */
    int syncs, downloads;
    /* compute -> copy: a sequence number per compute op, the last that read
     * each batch buffer, the mark of each event, the copy stream's floor */
    uint64_t seq, ev_seq[EVENTS], copy_floor;
    struct {
        const void *p;
        uint64_t seq;
    } reads[16];
    int after_waits, bad_reuse;
    /* the synchronous path's inputs: each loss computation's per-sample losses */
    int nlog, poison; /* poison: the training loss computation (1-based) made NaN */
    float log_loss[64][BATCH];
    int32_t log_correct[64][BATCH];
    int log_n[64];
} W;

static int upload_target(const void *p);

/* A compute op read p; only batch buffers (what uploads write) are followed. */
static void note_read(const void *p)
{
    int at = -1;
    W.seq++;
    if (!upload_target(p))
        return;
    for (int i = 0; i < 16; i++)
        if (W.reads[i].p == p || (at < 0 && !W.reads[i].p))
            at = i;
    if (at < 0)
        BAIL_OUT("too many read buffers");
    W.reads[at].p = p;
    W.reads[at].seq = W.seq;
}

static uint64_t last_read(const void *p)
{
    for (int i = 0; i < 16; i++)
        if (W.reads[i].p == p)
            return W.reads[i].seq;
    return 0;
}

static int inside(const struct region *r, int nr, const void *p, size_t n)
{
    for (int i = 0; i < nr; i++)
        if (r[i].p && (const char *)p >= r[i].p && (const char *)p + n <= r[i].p + r[i].n)
            return 1;
    return 0;
}

static void remember(struct region *r, int nr, const void *p, size_t n)
{
    for (int i = 0; i < nr; i++)
        if (!r[i].p) {
            r[i] = (struct region){p, n};
            return;
        }
    BAIL_OUT("too many regions");
}

static void forget(struct region *r, int nr, const void *p)
{
    for (int i = 0; i < nr; i++)
        if (r[i].p == p)
            r[i].p = NULL;
}

static int is_dev(const void *p, size_t n)
{
    return inside(W.dev, 64, p, n);
}

static void *w_alloc(struct mg_backend *be, size_t bytes)
{
    void *p = W.cpu->ops->alloc(W.cpu, bytes);
    if (p)
        remember(W.dev, 64, p, bytes);
    return p;
}

static void w_free(struct mg_backend *be, void *p)
{
    for (int i = 0; i < 64; i++) /* what was uploaded to and read in it is gone */
        if (W.dev[i].p == p)
            for (int j = 0; j < 16; j++) {
                if ((const char *)W.reads[j].p >= W.dev[i].p &&
                    (const char *)W.reads[j].p < W.dev[i].p + W.dev[i].n)
                    W.reads[j].p = NULL;
                if ((const char *)W.last[j].dst >= W.dev[i].p &&
                    (const char *)W.last[j].dst < W.dev[i].p + W.dev[i].n)
                    W.last[j].dst = NULL;
            }
    forget(W.dev, 64, p);
    W.cpu->ops->free(W.cpu, p);
}

static void note_upload(const void *dst, uint64_t ticket)
{
    int at = -1;
    for (int i = 0; i < 16; i++)
        if (W.last[i].dst == dst || (at < 0 && !W.last[i].dst))
            at = i;
    if (at < 0)
        BAIL_OUT("too many upload targets");
    W.last[at].dst = dst;
    W.last[at].ticket = ticket;
}

static int upload_target(const void *p)
{
    for (int i = 0; i < 16; i++)
        if (W.last[i].dst == p)
            return 1;
    return 0;
}

/* 0 when p was last written by a synchronous upload (an evaluation batch) */
static uint64_t ticket_of(const void *p)
{
    for (int i = 0; i < 16; i++)
        if (W.last[i].dst == p)
            return W.last[i].ticket;
    return 0;
}

static int w_sync(struct mg_backend *be)
{
    W.syncs++;
    return W.cpu->ops->sync(W.cpu);
}

static void w_download(struct mg_backend *be, void *dst, const void *src, size_t bytes)
{
    W.downloads++;
    W.cpu->ops->download(W.cpu, dst, src, bytes);
}

/* The copy stream waits for the compute work before the event. */
static void w_upload_after(struct mg_backend *be, void *ev)
{
    int i = (int)((int *)ev - W.tok);
    if (i >= 0 && i < EVENTS && W.used[i] && W.ev_seq[i] > W.copy_floor)
        W.copy_floor = W.ev_seq[i];
    W.after_waits++;
}

static void w_upload(struct mg_backend *be, void *dst, const void *src, size_t bytes)
{
    W.sync_uploads++;
    note_upload(dst, 0);
    W.cpu->ops->upload(W.cpu, dst, src, bytes);
}

static void *w_host_alloc(struct mg_backend *be, size_t bytes)
{
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64))
        return NULL;
    remember(W.pin, 8, p, bytes);
    return p;
}

static void w_host_free(struct mg_backend *be, void *p)
{
    forget(W.pin, 8, p);
    free(p);
}

static uint64_t w_upload_async(struct mg_backend *be, void *dst, const void *src, size_t bytes)
{
    if (!inside(W.pin, 8, src, bytes) || !is_dev(dst, bytes))
        W.bad_upload++;
    if (last_read(dst) > W.copy_floor)
        W.bad_reuse++; /* the copy could overwrite a batch the compute still reads */
    W.cpu->ops->upload(W.cpu, dst, src, bytes);
    note_upload(dst, ++W.tickets);
    return W.tickets;
}

static void w_upload_wait(struct mg_backend *be, uint64_t ticket)
{
    if (ticket > W.waited)
        W.waited = ticket;
}

static int w_upload_done(struct mg_backend *be, uint64_t ticket, int wait)
{
    return 1;
}

/* The device may read p only once the upload that wrote it was waited for. */
static void check_ready(const void *p)
{
    if (ticket_of(p) > W.waited)
        W.bad_order++;
}

static void *w_event_record(struct mg_backend *be)
{
    for (int i = 0; i < EVENTS; i++)
        if (!W.used[i]) {
            W.used[i] = 1;
            W.queued_from[i] = W.lowest;
            W.ev_seq[i] = W.seq;
            if (W.lowest > 0) /* backward has layers left to queue: overlap */
                W.early[W.training_steps < 1 ? 0 : 1]++;
            W.recorded++;
            return &W.tok[i];
        }
    return NULL;
}

static void w_event_release(struct mg_backend *be, void *ev)
{
    int i = (int)((int *)ev - W.tok);
    if (i < 0 || i >= EVENTS || !W.used[i])
        W.bad_release++;
    else
        W.used[i] = 0;
    W.released++;
}

static void w_linear_forward(struct mg_backend *be, float *y, const float *x, const float *w,
                             const float *b, int n, int in, int out, int relu)
{
    note_read(x);
    if (W.model && x == W.model->input && ticket_of(x)) { /* a training micro-batch */
        check_ready(x);
        W.forwards++;
        W.at_forward = W.tickets;
        W.lowest = W.model->nparams;
    }
    W.cpu->ops->linear_forward(W.cpu, y, x, w, b, n, in, out, relu);
}

static void grads_queued(const float *dw)
{
    const struct mg_model *m = W.model;
    if (m && dw >= m->grad_buf && dw < m->grad_buf + m->nparams &&
        (size_t)(dw - m->grad_buf) < W.lowest)
        W.lowest = (size_t)(dw - m->grad_buf);
}

static void w_linear_backward(struct mg_backend *be, float *dx, float *dw, float *db,
                              const float *dy, const float *x, const float *w, int n, int in,
                              int out, int accumulate, void *scratch)
{
    note_read(x);
    W.cpu->ops->linear_backward(W.cpu, dx, dw, db, dy, x, w, n, in, out, accumulate, scratch);
    grads_queued(dw);
}

/* What the synchronous path downloaded after each loss computation. */
static void log_losses(const float *loss, const int32_t *correct, int n)
{
    if (W.nlog >= 64)
        return;
    memcpy(W.log_loss[W.nlog], loss, (size_t)n * sizeof(float));
    memcpy(W.log_correct[W.nlog], correct, (size_t)n * sizeof(int32_t));
    W.log_n[W.nlog++] = n;
}

static void w_xent_forward(struct mg_backend *be, float *loss, int32_t *correct, float *probs,
                           const float *logits, const int32_t *labels, int n, int classes)
{
    check_ready(labels);
    note_read(labels);
    if (!ticket_of(labels)) { /* evaluation */
        W.cpu->ops->xent_forward(W.cpu, loss, correct, probs, logits, labels, n, classes);
        log_losses(loss, correct, n);
        return;
    }
    if (W.tickets > W.at_forward)
        W.prefetched++;
    if (W.nseen < 64) {
        W.cpu->ops->download(W.cpu, W.seen[W.nseen], labels, (size_t)n * 4);
        W.seen_n[W.nseen++] = n;
    }
    W.cpu->ops->xent_forward(W.cpu, loss, correct, probs, logits, labels, n, classes);
    if (++W.forwards_loss == W.poison)
        loss[n - 1] = NAN; /* a diverged micro-batch */
    log_losses(loss, correct, n);
}

static void w_xent_backward(struct mg_backend *be, float *dlogits, const float *probs,
                            const int32_t *labels, int n, int classes, float scale)
{
    note_read(labels);
    W.cpu->ops->xent_backward(W.cpu, dlogits, probs, labels, n, classes, scale);
}

/* Events the trainer holds between steps: one per batch slot, recorded after
 * the last compute that read the slot (the next upload into it waits for it). */
static int slot_events(const struct mg_trainer *t)
{
    return (t->slot[0].free_ev != NULL) + (t->slot[1].free_ev != NULL);
}

/* The wrapper, saying it is CUDA, over a CPU backend. */
static struct mg_backend *device_over(struct mg_backend *cpu)
{
    W.cpu = cpu;
    W.ops = *cpu->ops;
    W.ops.alloc = w_alloc;
    W.ops.free = w_free;
    W.ops.upload = w_upload;
    W.ops.host_alloc = w_host_alloc;
    W.ops.host_free = w_host_free;
    W.ops.upload_async = w_upload_async;
    W.ops.upload_wait = w_upload_wait;
    W.ops.upload_done = w_upload_done;
    W.ops.event_record = w_event_record;
    W.ops.event_release = w_event_release;
    W.ops.linear_forward = w_linear_forward;
    W.ops.linear_backward = w_linear_backward;
    W.ops.xent_forward = w_xent_forward;
    W.ops.xent_backward = w_xent_backward;
    W.ops.sync = w_sync;
    W.ops.download = w_download;
    W.ops.upload_after = w_upload_after;
    W.be = *cpu;
    W.be.ops = &W.ops;
    W.be.device = MG_DEVICE_CUDA;
    W.be.name = "a CPU that says it is a GPU";
    return &W.be;
}

/* ---- the trainer's batches -------------------------------------------------------------- */

static struct mg_dataset train_ds, test_ds;

static int make_model_sized(struct mg_model *m, struct mg_backend *be, uint64_t seed, char *err,
                            int h1, int h2);

static int make_model(struct mg_model *m, struct mg_backend *be, uint64_t seed, char *err)
{
    return make_model_sized(m, be, seed, err, 32, 24);
}

static int make_model_sized(struct mg_model *m, struct mg_backend *be, uint64_t seed, char *err,
                            int h1, int h2)
{
    struct mg_model_options mo = {.hidden = {h1, h2}, .nhidden = 2};
    memset(m, 0, sizeof(*m));
    int rc = mg_model_create(m, be, "mlp", &mo, BATCH, err);
    if (rc == 0)
        rc = mg_model_init_params(m, seed);
    return rc;
}

static int make_trainer(struct mg_trainer *t, struct mg_model *m,
                        const struct mg_train_hooks *hooks, int rank, int world, char *err)
{
    struct mg_train_config cfg = {.batch_size = BATCH,
                                  .accum_steps = 1,
                                  .total_steps = 100,
                                  .seed = 11,
                                  .rank = rank,
                                  .world = world};
    mg_optim_defaults(&cfg.optim, MG_OPTIM_SGD);
    cfg.optim.momentum = 0.9;
    cfg.sched = (struct mg_schedule){.kind = MG_SCHED_CONSTANT, .base_lr = 0.05, .total = 100};
    return mg_trainer_init(t, m, &train_ds, &test_ds, &cfg, hooks, err);
}

static void train(struct mg_trainer *t, int k)
{
    struct mg_step_stats st;
    for (int i = 0; i < k; i++)
        if (mg_trainer_step(t, &st) < 0)
            BAIL_OUT("step failed");
}

/* What micro-batch j of a run from step 0 holds, from a sampler of its own. */
static int expected(int j, int32_t *labels)
{
    static struct mg_sampler s;
    static int ready;
    if (!ready && mg_sampler_init(&s, train_ds.n, 0, 1, 1, MG_SAMPLER_PAD, 11) < 0)
        BAIL_OUT("sampler");
    ready = 1;
    long per = mg_sampler_batches(&s, BATCH);
    mg_sampler_set_epoch(&s, j / per);
    int from = (int)(j % per) * BATCH,
        n = s.num_samples - from < BATCH ? s.num_samples - from : BATCH;
    for (int i = 0; i < n; i++)
        labels[i] = train_ds.labels[s.indices[from + i]];
    return n;
}

static void test_batches(struct mg_backend *cpu)
{
    char err[MG_ERRMSG_LEN], dir[] = "/tmp/mg-test-ddp-device-XXXXXX", path[MG_CKPT_PATH_MAX];
    struct mg_model m, m2;
    struct mg_trainer t, t2;
    struct mg_eval_sums ev;
    struct mg_backend *dev = device_over(cpu);
    if (!mkdtemp(dir))
        BAIL_OUT("mkdtemp");
    if (make_model(&m, dev, 3, err) < 0 || make_trainer(&t, &m, NULL, 0, 1, err) < 0)
        BAIL_OUT("%s", err);
    W.model = &m;
    float *own_input = m.input;
    /* 100 samples, batches of 16: 7 per epoch, the last of 4 */
    train(&t, 5);
    W.sync_uploads = 0;
    is_int(W.bad_upload, 0, "training batches come from page-locked memory by upload_async");
    is_int(W.bad_order, 0, "... and each forward and loss runs after its upload was waited for");
    is_int(W.prefetched, 5, "the next micro-batch is queued while each computes (5 of 5)");
    ok(m.input != own_input, "the model reads the slot the batch was uploaded to");
    if (mg_trainer_evaluate(&t, &ev) < 0)
        BAIL_OUT("evaluate");
    ok(W.sync_uploads > 0, "evaluation uploads its batches as it goes");
    train(&t, 4);
    is_int(mg_trainer_save(&t, dir, NULL, 0, err), 0, "a checkpoint after 9 steps");
    mg_ckpt_mark_complete(dir, 9, 0, err);
    W.sync_uploads = 0;
    train(&t, 8); /* into the third epoch */
    is_int(W.sync_uploads, 0, "training uploads nothing synchronously");
    int per_epoch = 7, prefetched = W.prefetched, forwards = W.forwards;
    ok(forwards == 17 && prefetched == forwards - 2,
       "17 micro-batches: all but the last of each epoch had the next queued early (%d of %d)",
       prefetched, forwards);
    int right = W.nseen == 17;
    for (int j = 0; j < W.nseen && right; j++) {
        int32_t want[BATCH];
        int n = expected(j, want);
        right = n == W.seen_n[j] && !memcmp(want, W.seen[j], (size_t)n * 4);
        if (!right)
            diag("micro-batch %d (epoch %d, batch %d) holds other samples", j, j / per_epoch,
                 j % per_epoch);
    }
    ok(right, "every micro-batch holds the samples its sampler names, across 3 epochs and an "
              "evaluation");

    /* a fresh trainer resumes step 9: its first batch is uploaded at once, then prefetched */
    if (make_model(&m2, dev, 4, err) < 0 || make_trainer(&t2, &m2, NULL, 0, 1, err) < 0)
        BAIL_OUT("%s", err);
    W.model = &m2;
    mg_ckpt_path(dir, 9, path, sizeof(path));
    is_int(mg_trainer_load(&t2, path, err), 0, "resume the checkpoint of step 9");
    W.nseen = 0;
    train(&t2, 8);
    right = W.nseen == 8;
    for (int j = 0; j < W.nseen && right; j++) {
        int32_t want[BATCH];
        int n = expected(9 + j, want);
        right = n == W.seen_n[j] && !memcmp(want, W.seen[j], (size_t)n * 4);
    }
    ok(right, "after the resume, the micro-batches go on where the checkpoint was");
    is_int(W.bad_order, 0, "... each waited for");
    is_int(W.bad_reuse, 0,
           "no upload into a batch slot before the compute that read it is done (the copy waits "
           "for its event), over 3 epochs, an evaluation and a resume");
    ok(W.after_waits >= 20, "... every reuse of a slot waited for such an event (%d)",
       W.after_waits);
    ok(mg_model_param_hash(&m2) == mg_model_param_hash(&m), "... to the same parameters");
    mg_trainer_release(&t2);
    ok(m2.input != NULL && is_dev(m2.input, 4), "the model has its own input buffer back");
    mg_model_release(&m2);
    mg_trainer_release(&t);
    ok(m.input == own_input, "... both models");
    mg_model_release(&m);
    W.model = NULL;
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    if (system(cmd) != 0)
        diag("cannot remove %s", dir);
}

/* ---- a step without waits: the loss stays on the device ------------------------------------ */

/* What the synchronous path reported for log entries [from, from + steps * accum): each
 * micro-batch's losses downloaded and added on the host in sample order, then the
 * micro-batches of a step, then the steps. */
static void sync_sums(int from, int steps, int accum, double *loss, long *correct)
{
    double total = 0.0;
    long c = 0;
    for (int s = 0; s < steps; s++) {
        double step = 0.0;
        for (int a = 0; a < accum; a++) {
            int j = from + s * accum + a;
            double mb = 0.0;
            for (int i = 0; i < W.log_n[j]; i++) {
                mb += W.log_loss[j][i];
                c += W.log_correct[j][i];
            }
            step += mb;
        }
        total += step;
    }
    *loss = total;
    *correct = c;
}

static long logged_samples(int from, int count)
{
    long n = 0;
    for (int j = from; j < from + count; j++)
        n += W.log_n[j];
    return n;
}

static int same_double(double a, double b)
{
    return !memcmp(&a, &b, sizeof(a));
}

static void test_sync_free(struct mg_backend *cpu)
{
    char err[MG_ERRMSG_LEN];
    struct mg_backend *dev = device_over(cpu);
    for (int accum = 1; accum <= 3; accum += 2) {
        struct mg_model m;
        struct mg_trainer t;
        struct mg_train_sums got;
        struct mg_eval_sums ev;
        struct mg_train_config cfg = {.batch_size = BATCH,
                                      .accum_steps = accum,
                                      .total_steps = 100,
                                      .seed = 5,
                                      .rank = 0,
                                      .world = 1};
        mg_optim_defaults(&cfg.optim, MG_OPTIM_ADAMW);
        cfg.sched = (struct mg_schedule){.kind = MG_SCHED_CONSTANT, .base_lr = 0.01, .total = 100};
        if (make_model(&m, dev, 9, err) < 0 ||
            mg_trainer_init(&t, &m, &train_ds, &test_ds, &cfg, NULL, err) < 0)
            BAIL_OUT("%s", err);
        W.model = &m;
        W.nlog = 0;
        W.syncs = W.downloads = 0;
        train(&t, 5);
        ok(W.syncs == 0 && W.downloads == 0,
           "accumulation %d: 5 steps wait for the device nowhere (%d syncs, %d downloads)", accum,
           W.syncs, W.downloads);
        is_int(mg_trainer_sums(&t, &got, 0), 0, "... the loss figures read back");
        ok(W.downloads == 1 && W.syncs == 0 && t.readbacks == 1,
           "... in one download (%d), no other wait", W.downloads);
        double want;
        long wc;
        sync_sums(0, 5, accum, &want, &wc);
        ok(same_double(got.loss_sum, want) && got.correct == wc && got.steps == 5 &&
               got.samples == logged_samples(0, 5 * accum) && !got.bad_step,
           "... the synchronous path's loss and correct count, bit for bit (%.17g, %ld)",
           got.loss_sum, got.correct);
        train(&t, 3);
        is_int(mg_trainer_sums(&t, &got, 1), 0, "... 3 steps more, read with a reset");
        sync_sums(0, 8, accum, &want, &wc);
        ok(same_double(got.loss_sum, want) && got.correct == wc && got.steps == 8,
           "... the sums of all 8 steps, bit for bit: a read without a reset changes nothing");
        train(&t, 2);
        W.downloads = 0;
        mg_trainer_sums(&t, &got, 0);
        sync_sums(8 * accum, 2, accum, &want, &wc);
        ok(same_double(got.loss_sum, want) && got.correct == wc && got.steps == 2,
           "... after the reset, the 2 steps since, bit for bit");
        /* evaluation: 50 samples in batches of 16, summed as the host did, read once */
        int from = W.nlog;
        W.downloads = W.syncs = 0;
        if (mg_trainer_evaluate(&t, &ev) < 0)
            BAIL_OUT("evaluate");
        double eloss = 0.0;
        long ec = 0;
        for (int j = from; j < W.nlog; j++) {
            double b = 0.0;
            for (int i = 0; i < W.log_n[j]; i++) {
                b += W.log_loss[j][i];
                ec += W.log_correct[j][i];
            }
            eloss += b;
        }
        ok(W.nlog - from == 4 && same_double(ev.loss_sum, eloss) && ev.correct == ec &&
               ev.count == 50 && W.downloads == 1,
           "... evaluation: %d batches, the synchronous path's sums bit for bit, one download "
           "(%d)",
           W.nlog - from, W.downloads);
        mg_trainer_release(&t);
        mg_model_release(&m);
        W.model = NULL;
    }

    /* a NaN in micro-batch 8 of a run with accumulation 3: step 3 diverged */
    struct mg_model m;
    struct mg_trainer t;
    struct mg_train_sums got;
    struct mg_train_config cfg = {.batch_size = BATCH,
                                  .accum_steps = 3,
                                  .total_steps = 100,
                                  .seed = 5,
                                  .rank = 0,
                                  .world = 1};
    mg_optim_defaults(&cfg.optim, MG_OPTIM_SGD);
    cfg.sched = (struct mg_schedule){.kind = MG_SCHED_CONSTANT, .base_lr = 0.01, .total = 100};
    if (make_model(&m, dev, 9, err) < 0 ||
        mg_trainer_init(&t, &m, &train_ds, &test_ds, &cfg, NULL, err) < 0)
        BAIL_OUT("%s", err);
    W.model = &m;
    W.forwards_loss = 0;
    W.poison = 8;
    train(&t, 5);
    W.poison = 0;
    is_int(mg_trainer_sums(&t, &got, 0), 0, "a NaN loss in micro-batch 8 (accumulation 3)");
    ok(got.bad_step == 3 && isnan(got.bad_loss) && isnan(got.loss_sum),
       "... the device kept the first diverged step (%ld) and its loss for the read-back",
       got.bad_step);
    mg_trainer_release(&t);
    mg_model_release(&m);
    W.model = NULL;
}

/* ---- DDP ---------------------------------------------------------------------------------- */

/* A communicator over another that, like NCCL, takes only device memory
 * (when device_only) and has wait_event; it checks what DDP hands it. */
struct wcomm {
    struct mg_comm c;
    struct mg_comm *in;
    void *pending;
    int expect_events;
    int bad_buffer, bad_event, stale, buckets;
    /* allreduce_queue / wait_queued: queued since the last wait, the offset of
     * the last one queued, the fewest and most queued at a wait, the waits */
    int queued, waits, min_at_wait, max_at_wait, bad_queue_order;
    size_t last_queued;
};

static struct wcomm *WC(struct mg_comm *c)
{
    return (struct wcomm *)c;
}

static int pass(struct wcomm *w, int rc)
{
    if (rc) {
        w->c.failed = 1;
        w->c.failed_code = rc;
        snprintf(w->c.errmsg, sizeof(w->c.errmsg), "%s", mg_comm_errmsg(w->in));
    }
    return rc;
}

/* Device memory where the communicator takes it only, host memory elsewhere. */
static void check_buffer(struct wcomm *w, const void *p, size_t n)
{
    if (n && is_dev(p, n) != w->c.device_memory)
        w->bad_buffer++;
}

static int wc_allreduce(struct mg_comm *c, float *buf, size_t count, enum mg_reduce_op op,
                        int timeout_ms)
{
    struct wcomm *w = WC(c);
    const struct mg_model *m = W.model;
    check_buffer(w, buf, count * 4);
    if (w->expect_events && m && buf >= m->grad_buf && buf < m->grad_buf + m->nparams) {
        /* a bucket: it waits for its own event, recorded once backward had queued it */
        int i = w->pending ? (int)((int *)w->pending - W.tok) : -1;
        if (i < 0 || i >= EVENTS || !W.used[i] || W.queued_from[i] > (size_t)(buf - m->grad_buf))
            w->bad_event++;
        w->buckets++;
    } else if (w->pending) {
        w->stale++;
    }
    w->pending = NULL;
    return pass(w, mg_comm_allreduce(w->in, buf, count, op, timeout_ms));
}

/* Like NCCL's: queued, not waited for; the buckets must come in bucket order
 * (from the end of the buffer back), all before the step's one wait. */
static int wc_allreduce_queue(struct mg_comm *c, float *buf, size_t count, enum mg_reduce_op op,
                              int timeout_ms)
{
    struct wcomm *w = WC(c);
    const struct mg_model *m = W.model;
    if (m && buf >= m->grad_buf && buf < m->grad_buf + m->nparams) {
        size_t off = (size_t)(buf - m->grad_buf);
        if (w->queued && off >= w->last_queued)
            w->bad_queue_order++;
        w->last_queued = off;
    }
    w->queued++;
    return wc_allreduce(c, buf, count, op, timeout_ms);
}

static int wc_wait_queued(struct mg_comm *c, int timeout_ms)
{
    struct wcomm *w = WC(c);
    if (!w->waits || w->queued < w->min_at_wait)
        w->min_at_wait = w->queued;
    if (w->queued > w->max_at_wait)
        w->max_at_wait = w->queued;
    w->waits++;
    w->queued = 0;
    return 0;
}

static int wc_broadcast(struct mg_comm *c, void *buf, size_t len, int root, int timeout_ms)
{
    struct wcomm *w = WC(c);
    check_buffer(w, buf, len);
    w->stale += w->pending != NULL;
    return pass(w, mg_comm_broadcast(w->in, buf, len, root, timeout_ms));
}

static int wc_allgather(struct mg_comm *c, const void *send, void *recv, size_t len, int timeout_ms)
{
    struct wcomm *w = WC(c);
    check_buffer(w, send, len);
    check_buffer(w, recv, len * (size_t)c->world);
    w->stale += w->pending != NULL;
    return pass(w, mg_comm_allgather(w->in, send, recv, len, timeout_ms));
}

static int wc_barrier(struct mg_comm *c, int timeout_ms)
{
    return pass(WC(c), mg_comm_barrier(WC(c)->in, timeout_ms));
}

/* A device communicator's memory is the device's (NCCL's ncclMemAlloc), zero-filled. */
static int wc_mem_alloc(struct mg_comm *c, size_t bytes, void **out, int timeout_ms)
{
    if (c->device_memory) {
        *out = W.be.ops->alloc(&W.be, bytes);
        if (*out)
            W.be.ops->zero(&W.be, *out, bytes);
        return *out ? 0 : -ENOMEM;
    }
    return pass(WC(c), mg_comm_mem_alloc(WC(c)->in, bytes, out, timeout_ms));
}

static void wc_mem_free(struct mg_comm *c, void *p)
{
    if (c->device_memory)
        W.be.ops->free(&W.be, p);
    else
        mg_comm_mem_free(WC(c)->in, p);
}

static int wc_reduce_scatter(struct mg_comm *c, const float *send, float *recv, size_t recv_count,
                             enum mg_reduce_op op, int timeout_ms)
{
    struct wcomm *w = WC(c);
    const struct mg_model *m = W.model;
    check_buffer(w, send, recv_count * 4 * (size_t)c->world);
    check_buffer(w, recv, recv_count * 4);
    if (w->expect_events && m && send >= m->grad_buf && send < m->grad_buf + m->nparams) {
        int i = w->pending ? (int)((int *)w->pending - W.tok) : -1;
        if (i < 0 || i >= EVENTS || !W.used[i] || W.queued_from[i] > (size_t)(send - m->grad_buf))
            w->bad_event++;
        w->buckets++;
    } else if (w->pending) {
        w->stale++;
    }
    w->pending = NULL;
    return pass(w, mg_comm_reduce_scatter(w->in, send, recv, recv_count, op, timeout_ms));
}

static int wc_wait_event(struct mg_comm *c, void *ev)
{
    WC(c)->pending = ev;
    return 0;
}

static void wc_release(struct mg_comm *c)
{
    mg_comm_release(WC(c)->in);
}

static const struct mg_comm_ops wc_ops = {
    .name = "checking",
    .allreduce = wc_allreduce,
    .broadcast = wc_broadcast,
    .allgather = wc_allgather,
    .barrier = wc_barrier,
    .release = wc_release,
    .mem_alloc = wc_mem_alloc,
    .mem_free = wc_mem_free,
    .wait_event = wc_wait_event,
    .reduce_scatter = wc_reduce_scatter,
    .allreduce_queue = wc_allreduce_queue,
    .wait_queued = wc_wait_queued,
};

/* Two ranks on shared memory, each training 6 steps three ways: plain CPU DDP
 * (the reference bits), a device with a device communicator, a device with a
 * host communicator. Returns a bit mask of what went wrong. */
static int rank_main(int rank, const char *shm_name, struct mg_backend *cpu)
{
    int bad = 0;
    char err[MG_ERRMSG_LEN];
    struct mg_comm *inner = shm_comm_join(rank, 2, shm_name, 1);
    if (!inner)
        return 1 << 30;
    uint64_t want = 0;
    for (int mode = 0; mode < 3; mode++) {
        /* 0: the CPU; 1: a device and a device communicator; 2: a device, a host one */
        struct wcomm w = {.in = inner, .expect_events = mode == 1};
        w.c = *inner;
        w.c.ops = &wc_ops;
        w.c.device_memory = mode == 1;
        struct mg_comm *c = mode == 0 ? inner : &w.c;
        struct mg_backend *be = mode == 0 ? cpu : device_over(cpu);
        struct mg_model m;
        struct mg_trainer t;
        struct mg_ddp *d;
        struct mg_train_hooks h;
        /* a bucket per layer: 250, 792 and 25120 floats */
        struct mg_ddp_opts o = {.bucket_cap = 1 << 10, .first_bucket = 256};
        /* rank 0's parameters must win the broadcast */
        if (make_model(&m, be, 3 + (uint64_t)rank, err) < 0)
            return 1 << 28;
        if (mg_ddp_create(&d, c, &m, &o, err, sizeof(err)) < 0)
            return 1 << 27;
        mg_ddp_hooks(d, &h);
        if (make_trainer(&t, &m, &h, rank, 2, err) < 0)
            return 1 << 26;
        W.model = &m;
        W.recorded = W.released = W.bad_release = 0;
        if (mg_trainer_start(&t) < 0)
            bad |= 1 << (mode * 8);
        struct mg_step_stats st;
        W.early[0] = W.early[1] = 0;
        for (int s = 0; s < 6; s++) {
            W.training_steps = s;
            if (mg_trainer_step(&t, &st) < 0)
                bad |= 1 << (mode * 8);
            if (W.recorded - W.released != slot_events(&t))
                bad |= 2 << (mode * 8); /* an event still out after the step */
        }
        /* DDP's: all but the trainer's one per micro-batch (a device only) */
        int ddp_events = W.recorded - (mode ? 6 : 0);
        struct mg_eval_sums ev;
        struct mg_rank_state mine, all[2];
        double me = rank + 0.5, both[2] = {0, 0};
        mg_trainer_rank_state(&t, &mine);
        if (mg_ddp_allgather(d, &me, both, sizeof(me)) || both[0] != 0.5 || both[1] != 1.5 ||
            mg_ddp_check_replicas(d, 6) || mg_trainer_evaluate(&t, &ev) || ev.count != 50 ||
            mg_ddp_gather_rank_states(d, &mine, all) || all[1].rank != 1 ||
            mg_ddp_check_resume(d, &t))
            bad |= 4 << (mode * 8); /* the host exchanges */
        const struct mg_ddp_bucket *b;
        int nb = mg_ddp_buckets(d, &b);
        if (mode == 1 && (ddp_events != 6 * nb || w.buckets != 6 * nb || w.bad_event))
            bad |= 8 << (mode * 8); /* one event per bucket, each allreduce after its own */
        if (mode == 1 && (w.waits != 6 || w.min_at_wait != nb || w.max_at_wait != nb ||
                          w.bad_queue_order || W.early[0] || !W.early[1]))
            bad |= 64 << (mode * 8); /* every bucket queued, in order, then one wait a step */
        if (mode != 1 && ddp_events)
            bad |= 8 << (mode * 8);
        if (w.bad_buffer || w.stale || W.bad_release || nb < 3)
            bad |= 16 << (mode * 8);
        uint64_t hash = mg_model_param_hash(&m);
        if (mode == 0)
            want = hash;
        else if (hash != want)
            bad |= 32 << (mode * 8); /* not the plain CPU's bits */
        mg_trainer_release(&t);
        mg_ddp_release(d);
        mg_model_release(&m);
        W.model = NULL;
    }
    mg_comm_release(inner);
    return bad;
}

/* One rank with DDP's communication thread forced (mg_ddp_opts.force_thread, what
 * MG_TEST_COMM_THREAD=1 asks for so that one GPU runs the overlap path): a device and a
 * device communicator over the single-rank one. The thread runs as at world size 2 (an event
 * per bucket, each allreduce after its own, every event returned) and the parameters are a
 * run's without DDP; without the flag, one rank records no events. */
static void test_world1_thread(struct mg_backend *cpu)
{
    char err[MG_ERRMSG_LEN];
    uint64_t want = 0;
    for (int mode = 0; mode < 3; mode++) {
        /* 0: no DDP, the CPU; 1: DDP, the thread forced; 2: DDP, not forced */
        struct mg_comm *inner = NULL;
        if (mg_comm_single_create(&inner) < 0)
            BAIL_OUT("no single-rank communicator");
        struct wcomm w = {.in = inner, .expect_events = mode == 1};
        w.c = *inner;
        w.c.ops = &wc_ops;
        w.c.device_memory = 1;
        struct mg_backend *be = mode == 0 ? cpu : device_over(cpu);
        struct mg_model m;
        struct mg_trainer t;
        struct mg_ddp *d = NULL;
        struct mg_train_hooks h;
        struct mg_ddp_opts o = {
            .bucket_cap = 1 << 10, .first_bucket = 256, .force_thread = mode == 1};
        if (make_model(&m, be, 3, err) < 0)
            BAIL_OUT("%s", err);
        if (mode && mg_ddp_create(&d, &w.c, &m, &o, err, sizeof(err)) < 0)
            BAIL_OUT("%s", err);
        if (d)
            mg_ddp_hooks(d, &h);
        if (make_trainer(&t, &m, d ? &h : NULL, 0, 1, err) < 0)
            BAIL_OUT("%s", err);
        W.model = &m;
        W.recorded = W.released = W.bad_release = 0;
        int failed = mg_trainer_start(&t) < 0, out = 0;
        struct mg_step_stats st;
        W.early[0] = W.early[1] = 0;
        for (int s = 0; s < 6; s++) {
            W.training_steps = s;
            failed |= mg_trainer_step(&t, &st) < 0;
            out |= W.recorded - W.released != slot_events(&t);
        }
        int ddp_events = W.recorded - (mode ? 6 : 0); /* less the trainer's, one per step */
        const struct mg_ddp_bucket *b;
        int nb = d ? mg_ddp_buckets(d, &b) : 0;
        uint64_t hash = mg_model_param_hash(&m);
        if (mode == 0) {
            want = hash;
        } else if (mode == 1) {
            ok(!failed && nb >= 3 && ddp_events == 6 * nb && w.buckets == 6 * nb && !w.bad_event &&
                   !out && !W.bad_release && !w.bad_buffer && !w.stale,
               "one rank, the communication thread forced: an event per bucket (%d of %d), each "
               "allreduce after its own, every event returned",
               ddp_events, 6 * nb);
            ok(w.waits == 6 && w.min_at_wait == nb && w.max_at_wait == nb && !w.bad_queue_order,
               "... every bucket queued behind the one before with no wait, in bucket order, "
               "then one wait a step (%d waits, %d to %d queued at each)",
               w.waits, w.min_at_wait, w.max_at_wait);
            ok(!W.early[0] && W.early[1] > 0,
               "... the first step sends no bucket during backward (every kernel launched once "
               "before any collective: lazy module loading), the later ones do (%d, %d)",
               W.early[0], W.early[1]);
            ok(hash == want, "... and the parameters of a run without DDP, bit for bit");
        } else {
            ok(!failed && ddp_events == 0 && hash == want,
               "one rank without the flag: no thread, no events (%d), the same bits", ddp_events);
        }
        mg_trainer_release(&t);
        if (d)
            mg_ddp_release(d);
        mg_model_release(&m);
        mg_comm_release(inner);
        W.model = NULL;
    }
}

/* ZeRO-1 on a device with a device communicator (NCCL's way), 2 ranks: plain CPU DDP's
 * bits; the gradients and parameters in the communicator's (device) memory; an event per
 * bucket before its reduce-scatter; the optimizer state gathered for a checkpoint through
 * device memory to the bits CPU ZeRO-1 gathers, and sharded back to the same shard. */
static int zero_rank_main(int rank, const char *shm_name, struct mg_backend *cpu)
{
    int bad = 0;
    char err[MG_ERRMSG_LEN];
    struct mg_comm *inner = shm_comm_join(rank, 2, shm_name, 1);
    if (!inner)
        return 1 << 30;
    uint64_t want = 0;
    float *ref = NULL;
    size_t reflen = 0;
    for (int mode = 0; mode < 3; mode++) {
        /* 0: CPU DDP; 1: CPU ZeRO-1; 2: ZeRO-1 on a device with a device communicator */
        struct wcomm w = {.in = inner, .expect_events = mode == 2};
        w.c = *inner;
        w.c.ops = &wc_ops;
        w.c.device_memory = mode == 2;
        struct mg_comm *c = mode < 2 ? inner : &w.c;
        struct mg_backend *be = mode < 2 ? cpu : device_over(cpu);
        struct mg_model m;
        struct mg_trainer t;
        struct mg_ddp *d;
        struct mg_train_hooks h;
        struct mg_ddp_opts o = {.bucket_cap = 1 << 10, .first_bucket = 256, .zero = mode > 0};
        /* odd layer sizes (24304 + 31, 713 + 23, 230 + 10): buckets that do not split in two
         * unless padded */
        if (make_model_sized(&m, be, 3 + (uint64_t)rank, err, 31, 23) < 0)
            return 1 << 28;
        if (mg_ddp_create(&d, c, &m, &o, err, sizeof(err)) < 0) {
            fprintf(stderr, "mode %d: %s\n", mode, err);
            return 1 << 27;
        }
        mg_ddp_hooks(d, &h);
        if (make_trainer(&t, &m, &h, rank, 2, err) < 0)
            return 1 << 26;
        W.model = &m;
        W.recorded = W.released = W.bad_release = 0;
        if (mg_trainer_start(&t) < 0)
            bad |= 1 << (mode * 8);
        struct mg_step_stats st;
        for (int s = 0; s < 6; s++)
            if (mg_trainer_step(&t, &st) < 0)
                bad |= 1 << (mode * 8);
        const struct mg_ddp_bucket *b;
        int nb = mg_ddp_buckets(d, &b);
        if (mode == 2 && (W.recorded - 6 != 6 * nb || w.buckets != 6 * nb || w.bad_event ||
                          W.recorded - W.released != slot_events(&t)))
            bad |= 2 << (mode * 8); /* an event per bucket, each reduce-scatter after its own */
        uint64_t hash = mg_model_param_hash(&m);
        if (mode == 0)
            want = hash;
        else if (hash != want)
            bad |= 8 << (mode * 8); /* not plain DDP's bits */
        if (mode > 0) {
            /* a checkpoint's state: gathered whole, then sharded back */
            size_t n = m.nparams, len = t.opt.state_count;
            if (mg_trainer_gather_state(&t) < 0 || !t.gathered) {
                bad |= 16 << (mode * 8);
            } else if (mode == 1) {
                reflen = n;
                ref = malloc(n * sizeof(float));
                if (ref)
                    memcpy(ref, t.gathered, n * sizeof(float));
            } else {
                if (!ref || reflen != n || memcmp(ref, t.gathered, n * sizeof(float)))
                    bad |= 16 << (mode * 8); /* not CPU ZeRO's gathered state */
                float *shard = be->ops->alloc(be, len * sizeof(float));
                float *a = malloc(len * sizeof(float)), *z = malloc(len * sizeof(float));
                int uploads = W.sync_uploads;
                if (shard && a && z) {
                    h.shard_state(h.ctx, t.gathered, shard, 1);
                    if (W.sync_uploads == uploads)
                        bad |= 32 << (mode * 8); /* written into device memory from the host */
                    be->ops->download(be, a, shard, len * sizeof(float));
                    be->ops->download(be, z, t.opt.state, len * sizeof(float));
                    if (memcmp(a, z, len * sizeof(float)))
                        bad |= 32 << (mode * 8); /* sharding back gives another shard */
                } else {
                    bad |= 32 << (mode * 8);
                }
                if (shard)
                    be->ops->free(be, shard);
                free(a);
                free(z);
            }
        }
        if (w.bad_buffer || w.stale || W.bad_release || nb < 3)
            bad |= 4 << (mode * 8); /* every buffer where the communicator takes it */
        mg_trainer_release(&t);
        mg_ddp_release(d);
        mg_model_release(&m);
        W.model = NULL;
    }
    free(ref);
    mg_comm_release(inner);
    return bad;
}

static int ranks_of(int (*fn)(int, const char *, struct mg_backend *), struct mg_backend *cpu);

static void test_zero_device(struct mg_backend *cpu)
{
    int bad = ranks_of(zero_rank_main, cpu);
    int b = bad < 0 ? 0xff : (bad >> 16) & 0xff;
    ok(bad >= 0 && !(bad >> 24) && !(b & 1) && !((bad >> 8) & 0xff),
       "ZeRO-1 on a device with a device communicator, 2 ranks: start and 6 steps (CPU ZeRO-1 "
       "too)");
    ok(!(b & 2), "... an event per bucket, each reduce-scatter after its own, every one returned");
    ok(!(b & 4), "... gradients, parameters and state exchanges in device memory, several buckets");
    ok(!(b & 8), "... the parameters of plain CPU DDP, bit for bit");
    ok(!(b & 16), "... the optimizer state gathered for a checkpoint: CPU ZeRO-1's bits");
    ok(!(b & 32), "... and sharded back: the shard each rank holds");

    /* a device with a host communicator (MG_COMM=cpu on CUDA): refused, saying what to use */
    struct mg_comm *single = NULL;
    struct mg_model m;
    struct mg_ddp *d = NULL;
    char err[MG_ERRMSG_LEN] = "";
    struct mg_ddp_opts o = {.zero = 1};
    if (mg_comm_single_create(&single) < 0 || make_model(&m, device_over(cpu), 3, err) < 0)
        BAIL_OUT("set-up: %s", err);
    int rc = mg_ddp_create(&d, single, &m, &o, err, sizeof(err));
    ok(rc == -MG_EUNSUPPORTED && strstr(err, "ZeRO-1 (--zero 1) on a GPU needs a communicator on "
                                             "the GPU (NCCL: MG_COMM=auto or nccl)"),
       "ZeRO-1 on a device with a host communicator: refused: %s", err);
    if (d)
        mg_ddp_release(d);
    mg_model_release(&m);
    mg_comm_release(single);
}

static int ranks(struct mg_backend *cpu)
{
    return ranks_of(rank_main, cpu);
}

static int ranks_of(int (*fn)(int, const char *, struct mg_backend *), struct mg_backend *cpu)
{
    char name[64];
    pid_t pids[2];
    int fds[2][2], bad = 0;
    snprintf(name, sizeof(name), "/mg-test-ddp-device-%d", (int)getpid());
    fflush(stdout);
    for (int r = 0; r < 2; r++) {
        if (pipe(fds[r]))
            BAIL_OUT("pipe");
        pids[r] = fork();
        if (pids[r] == 0) {
            alarm(100);
            int got = fn(r, name, cpu);
            _exit(write(fds[r][1], &got, sizeof(got)) == sizeof(got) ? 0 : 1);
        }
        close(fds[r][1]);
    }
    for (int r = 0; r < 2; r++) {
        int got = -1, st;
        if (read(fds[r][0], &got, sizeof(got)) != sizeof(got))
            got = -1;
        close(fds[r][0]);
        waitpid(pids[r], &st, 0);
        if (got)
            diag("rank %d: what went wrong: %#x (status %d)", r, got, st);
        bad |= got;
    }
    mg_shm_unlink(name);
    return bad;
}

int main(void)
{
    struct mg_backend *cpu;
    char err[MG_ERRMSG_LEN];
    if (mg_backend_create(MG_DEVICE_CPU, NULL, &cpu) < 0)
        BAIL_OUT("no cpu backend");
    if (mg_dataset_load(&train_ds, MG_DATA_SYNTHETIC, NULL, 1, 100, err) < 0 ||
        mg_dataset_load(&test_ds, MG_DATA_SYNTHETIC, NULL, 0, 50, err) < 0)
        BAIL_OUT("%s", err);
    test_batches(cpu);
    test_sync_free(cpu);

    int bad = ranks(cpu);
    const char *modes[3] = {"the CPU", "a device with a device communicator (NCCL's way)",
                            "a device with a host communicator (MG_COMM=cpu on CUDA)"};
    for (int mode = 0; mode < 3; mode++) {
        int b = bad < 0 ? 0xff : (bad >> (mode * 8)) & 0xff;
        ok(!(b & 1), "DDP on %s, 2 ranks: start and 6 steps", modes[mode]);
        ok(!(b & 2), "... every event returned by the end of its step");
        ok(!(b & 4), "... the program's allgather, replicas checked, evaluation, rank states and "
                     "resume check through its exchanges");
        ok(!(b & 8), mode == 1 ? "... one event per bucket, and each bucket's allreduce waits "
                                 "for its own, recorded once backward had queued the bucket"
                               : "... no events");
        ok(!(b & 16), "... every buffer where the communicator takes it (device or host), no "
                      "stale wait, several buckets");
        if (mode)
            ok(!(b & 32), "... and the parameters of plain CPU DDP, bit for bit");
        if (mode == 1)
            ok(!(b & 64), "... each bucket's allreduce queued without waiting for the one "
                          "before, in bucket order, and one wait for them all per step; none "
                          "during the first step's backward, some during the later ones'");
    }
    ok(bad >= 0 && !(bad >> 24), "both ranks set up");
    test_world1_thread(cpu);
    test_zero_device(cpu);
    mg_dataset_release(&train_ds);
    mg_dataset_release(&test_ds);
    mg_backend_release(cpu);
    return done_testing();
}
