/* Training steps and evaluation (see trainer.h); what a checkpoint holds is
 * trainer_ckpt.c's. */
#include "trainer.h"
#include "progress.h"
#include "mg_err.h"
#include "trainer_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static int slots_init(struct mg_trainer *t, size_t sample);
static void slots_release(struct mg_trainer *t);

long mg_steps_for_epochs(long epochs, int dataset_n, int world, int drop_last, int batch, int accum)
{
    long per_rank = drop_last ? dataset_n / world : ((long)dataset_n + world - 1) / world;
    long batches = (per_rank + batch - 1) / batch;
    return (epochs * batches + accum - 1) / accum;
}

long mg_trainer_steps_for_epochs(const struct mg_trainer *t, long epochs)
{
    long micro = 0;
    if (t->epoch < epochs) {
        micro = t->pass_batches - t->batch_in_epoch;
        if (micro < 0)
            micro = 0;
        micro += (epochs - t->epoch - 1) * t->batches_per_epoch;
    }
    return t->step + (micro + t->cfg.accum_steps - 1) / t->cfg.accum_steps;
}

int mg_trainer_init(struct mg_trainer *t, struct mg_model *m, const struct mg_dataset *train,
                    const struct mg_dataset *test, const struct mg_train_config *cfg,
                    const struct mg_train_hooks *hooks, char *err)
{
    int rc;
    memset(t, 0, sizeof(*t));
    t->cfg = *cfg;
    t->model = m;
    t->train = train;
    t->test = test;
    if (hooks)
        t->hooks = *hooks;
    if (cfg->batch_size <= 0 || cfg->batch_size > m->max_batch)
        return mg_seterr(err, MG_ERRMSG_LEN, -EINVAL, "batch size %d is not in 1..%d",
                         cfg->batch_size, m->max_batch);
    if (cfg->accum_steps < 1)
        return mg_seterr(err, MG_ERRMSG_LEN, -EINVAL, "accumulation steps must be >= 1");
    size_t sample = (size_t)m->in_dims[0] * m->in_dims[1] * m->in_dims[2];
    if (mg_dataset_sample_size(train) != sample || (test && mg_dataset_sample_size(test) != sample))
        return mg_seterr(err, MG_ERRMSG_LEN, -MG_ESHAPE,
                         "model %s takes %zu values per sample, the data has %zu", m->name, sample,
                         mg_dataset_sample_size(train));
    if (train->classes != m->classes)
        return mg_seterr(err, MG_ERRMSG_LEN, -MG_ESHAPE, "model %s has %d classes, the data %d",
                         m->name, m->classes, train->classes);
    rc = mg_optim_check(&cfg->optim, err);
    if (rc < 0)
        return rc;
    rc = mg_sampler_init(&t->sampler, train->n, cfg->rank, cfg->world, 1, mg_train_mode(cfg),
                         cfg->seed);
    if (rc < 0) {
        mg_seterr(err, MG_ERRMSG_LEN, rc, "cannot shard %d training samples over %d ranks",
                  train->n, cfg->world);
        goto fail;
    }
    if (test) {
        rc = mg_sampler_init(&t->eval_sampler, test->n, cfg->rank, cfg->world, 0, MG_SAMPLER_UNEVEN,
                             0);
        if (rc < 0) {
            mg_seterr(err, MG_ERRMSG_LEN, rc, "cannot shard %d test samples over %d ranks", test->n,
                      cfg->world);
            goto fail;
        }
        mg_sampler_set_epoch(&t->eval_sampler, 0);
    }
    t->batches_per_epoch = mg_sampler_batches(&t->sampler, cfg->batch_size);
    t->pass_batches = t->batches_per_epoch;
    /* a sharded optimizer keeps its shard's state only */
    rc = mg_optim_init(&t->opt, m->be, &cfg->optim,
                       t->hooks.begin_update ? t->hooks.shard_len : m->nparams);
    if (rc < 0) {
        mg_seterr(err, MG_ERRMSG_LEN, rc, "out of memory for the optimizer state");
        goto fail;
    }
    t->x_host = malloc(sizeof(float) * sample * (size_t)m->max_batch);
    t->y_host = malloc(sizeof(int32_t) * (size_t)m->max_batch);
    t->acc = m->be->ops->alloc(m->be, 2 * MG_ACC_LEN * sizeof(double)); /* zero-filled */
    t->host_state = malloc(
        sizeof(float) * (m->nparams + (t->hooks.begin_update ? 0 : mg_trainer_state_count(t))) + 1);
    if (!t->x_host || !t->y_host || !t->host_state || !t->acc) {
        rc = mg_seterr(err, MG_ERRMSG_LEN, -ENOMEM, "out of memory for batch buffers");
        goto fail;
    }
    m->dropout_rng.seed = mg_dropout_seed(cfg->seed, cfg->rank);
    m->dropout_rng.offset = 0;
    rc = slots_init(t, sample);
    if (rc < 0) {
        mg_seterr(err, MG_ERRMSG_LEN, rc, "out of memory for batch buffers");
        goto fail;
    }
    return 0;
fail:
    mg_trainer_release(t);
    return rc;
}

void mg_trainer_release(struct mg_trainer *t)
{
    slots_release(t);
    mg_optim_release(&t->opt);
    mg_sampler_release(&t->sampler);
    mg_sampler_release(&t->eval_sampler);
    if (t->acc)
        t->model->be->ops->free(t->model->be, t->acc);
    t->acc = NULL;
    free(t->x_host);
    free(t->y_host);
    free(t->host_state);
    free(t->gathered);
    t->gathered = NULL;
    t->x_host = NULL;
    t->y_host = NULL;
    t->host_state = NULL;
}

int mg_trainer_start(struct mg_trainer *t)
{
    if (!t->hooks.broadcast_params)
        return 0;
    int rc = t->hooks.broadcast_params(t->hooks.ctx, t->model->param_buf, t->model->nparams);
    return rc < 0 ? rc : t->model->be->ops->sync(t->model->be);
}

/* Evaluation's batches: gathered and uploaded at once, into the buffers of
 * the micro-batch that computed last (the next one's slot may be uploading). */
static void upload_batch(struct mg_trainer *t, const struct mg_dataset *ds, const int32_t *idx,
                         int n)
{
    struct mg_model *m = t->model;
    size_t sample = mg_dataset_sample_size(ds);
    mg_dataset_gather(ds, idx, n, t->x_host, t->y_host);
    m->be->ops->upload(m->be, m->input, t->x_host, sizeof(float) * sample * (size_t)n);
    m->be->ops->upload(m->be, m->labels, t->y_host, sizeof(int32_t) * (size_t)n);
}

/* ---- training batches (struct mg_batch_slot) ---------------------------------------- */

static int slots_init(struct mg_trainer *t, size_t sample)
{
    struct mg_model *m = t->model;
    struct mg_backend *be = m->be;
    size_t xbytes = sizeof(float) * sample * (size_t)m->max_batch;
    size_t ybytes = sizeof(int32_t) * (size_t)m->max_batch;
    for (int s = 0; s < 2; s++) {
        struct mg_batch_slot *b = &t->slot[s];
        b->batch = -1;
        b->x_pin = mg_backend_host_alloc(be, xbytes + ybytes);
        if (!b->x_pin)
            return -ENOMEM;
        b->y_pin = (int32_t *)(void *)((char *)b->x_pin + xbytes);
    }
    t->slot[0].x_dev = m->input;
    t->slot[0].y_dev = m->labels;
    t->slot[1].x_dev = be->ops->alloc(be, xbytes);
    t->slot[1].y_dev = be->ops->alloc(be, ybytes);
    if (!t->slot[1].x_dev || !t->slot[1].y_dev)
        return -ENOMEM;
    t->cur = 0;
    return 0;
}

/* The model gets its own input buffers back. */
static void slots_release(struct mg_trainer *t)
{
    struct mg_model *m = t->model;
    if (!m || !m->be)
        return;
    for (int s = 0; s < 2; s++) {
        if (t->slot[s].x_pin)
            mg_backend_host_free(m->be, t->slot[s].x_pin);
        mg_backend_event_release(m->be, t->slot[s].free_ev);
    }
    if (t->slot[1].x_dev)
        m->be->ops->free(m->be, t->slot[1].x_dev);
    if (t->slot[1].y_dev)
        m->be->ops->free(m->be, t->slot[1].y_dev);
    if (t->slot[0].x_dev) {
        m->input = t->slot[0].x_dev;
        m->labels = t->slot[0].y_dev;
    }
    memset(t->slot, 0, sizeof(t->slot));
}

/* Where the micro-batch after the current position is: the next of this
 * pass, or the first of the next epoch. */
static void following(const struct mg_trainer *t, long *epoch, long *start, long *batch)
{
    if (t->batch_in_epoch >= t->pass_batches) {
        *epoch = t->epoch + 1;
        *start = 0;
        *batch = 0;
    } else {
        *epoch = t->epoch;
        *start = t->epoch_start;
        *batch = t->batch_in_epoch;
    }
}

/* The compute queued so far is the last to read slot s's device buffers: the
 * next upload into them waits for it (on the device). */
static void slot_used(struct mg_trainer *t, int s)
{
    struct mg_backend *be = t->model->be;
    mg_backend_event_release(be, t->slot[s].free_ev);
    t->slot[s].free_ev = mg_backend_event_record(be);
}

/* Gathers micro-batch (epoch, start, batch) into slot s and queues its
 * upload, behind the compute that last read the slot's device buffers (its
 * free_ev): the host does not wait for that compute, only for the pinned
 * buffer's previous copy (two micro-batches back) to be done. */
static void stage(struct mg_trainer *t, int s, long epoch, long start, long batch)
{
    struct mg_model *m = t->model;
    struct mg_batch_slot *b = &t->slot[s];
    size_t sample = mg_dataset_sample_size(t->train);
    mg_sampler_set_pass(&t->sampler, epoch, start);
    long from = batch * t->cfg.batch_size, left = t->sampler.pass_samples - from;
    int n = left < t->cfg.batch_size ? (int)left : t->cfg.batch_size;
    /* the pinned buffer's last upload must be done before it is written again */
    mg_backend_upload_done(m->be, b->ticket, 1);
    mg_dataset_gather(t->train, t->sampler.indices + from, n, b->x_pin, b->y_pin);
    if (b->free_ev) {
        mg_backend_upload_after(m->be, b->free_ev);
        mg_backend_event_release(m->be, b->free_ev); /* the wait is queued: it keeps its mark */
        b->free_ev = NULL;
    }
    mg_backend_upload_async(m->be, b->x_dev, b->x_pin, sizeof(float) * sample * (size_t)n);
    b->ticket = mg_backend_upload_async(m->be, b->y_dev, b->y_pin, sizeof(int32_t) * (size_t)n);
    b->epoch = epoch;
    b->start = start;
    b->batch = batch;
    b->n = n;
}

/* While the current micro-batch computes: the next one into the other slot,
 * when it is of the same pass (the sampler keeps describing the pass being
 * trained on; the first batch of an epoch is uploaded when it starts). A
 * backend without a copy stream (the CPU) has nothing to overlap: its batch
 * is gathered when it starts, where it is still in cache. */
static void prefetch(struct mg_trainer *t)
{
    long epoch, start, batch;
    if (!t->model->be->ops->upload_async)
        return;
    following(t, &epoch, &start, &batch);
    if (epoch == t->sampler.epoch && start == t->sampler.start)
        stage(t, t->cur ^ 1, epoch, start, batch);
}

/* Makes the next micro-batch the model's input (uploaded already when the
 * prefetch guessed right, now otherwise) and moves the position past it;
 * returns its size. */
static int next_batch(struct mg_trainer *t)
{
    struct mg_model *m = t->model;
    long epoch, start, batch;
    following(t, &epoch, &start, &batch);
    int s = t->cur ^ 1;
    struct mg_batch_slot *b = &t->slot[s];
    if (b->batch != batch || b->epoch != epoch || b->start != start)
        stage(t, s, epoch, start, batch);
    mg_backend_upload_wait(m->be, b->ticket);
    m->input = b->x_dev;
    m->labels = b->y_dev;
    t->cur = s;
    b->batch = -1; /* consumed: the slot is the current one's now */
    if (epoch != t->epoch) {
        t->epoch = epoch;
        t->epoch_start = 0;
        t->batch_in_epoch = 0;
        t->pass_batches = t->batches_per_epoch;
    }
    t->batch_in_epoch++;
    t->samples_seen += (uint64_t)b->n;
    return b->n;
}

struct ready_ctx {
    struct mg_trainer *t;
    double lr;
};

static int on_grad_ready(void *ctx, size_t offset, size_t count)
{
    struct mg_trainer *t = ((struct ready_ctx *)ctx)->t;
    return t->hooks.grad_ready(t->hooks.ctx, t->model->grad_buf, offset, count);
}

/* Single process, no accumulation: update each layer as soon as its gradients are
 * final, while they are still in cache. Same bits as one update after backward: a
 * layer's weights are not used by the backward of the layers before it. */
static int update_ready(void *ctx, size_t offset, size_t count)
{
    struct ready_ctx *r = ctx;
    mg_optim_update_range(&r->t->opt, r->t->model->param_buf, r->t->model->grad_buf, r->lr, offset,
                          count);
    return 0;
}

int mg_trainer_step(struct mg_trainer *t, struct mg_step_stats *st)
{
    struct mg_model *m = t->model;
    struct ready_ctx rctx = {t, mg_schedule_lr(&t->cfg.sched, t->step)};
    int fused = !t->hooks.grad_ready && !t->hooks.reduce_grads && t->cfg.accum_steps == 1;
    int sharded = t->hooks.begin_update != NULL;
    int rc;
    memset(st, 0, sizeof(*st));
    st->lr = rctx.lr;
    mg_progress_step_begin();
    free(t->gathered); /* a checkpoint's, if this rank did not write it */
    t->gathered = NULL;
    if (sharded) {
        rc = t->hooks.begin_update(t->hooks.ctx, &t->opt, rctx.lr);
        if (rc < 0)
            return rc;
    }
    for (int a = 0; a < t->cfg.accum_steps; a++) {
        mg_progress_phase(MG_PH_DATA);
        int n = next_batch(t);
        int last = a == t->cfg.accum_steps - 1;
        mg_progress_phase(MG_PH_COMPUTE);
        mg_model_forward(m, n, 1);
        prefetch(t); /* while the forward runs on a device */
        mg_model_loss_queue(m, n, t->acc, last, t->step + 1);
        int (*ready)(void *, size_t, size_t) = NULL;
        if (fused)
            ready = update_ready;
        else if (last && t->hooks.grad_ready)
            ready = on_grad_ready;
        rc = mg_model_backward(m, n, 1.0f / ((float)n * (float)t->cfg.accum_steps), a > 0, ready,
                               &rctx);
        slot_used(t, t->cur); /* this micro-batch's compute is the last to read its batch */
        if (rc < 0)
            return rc;
        st->samples += n;
    }
    t->sum_samples += st->samples;
    t->sum_steps++;
    mg_progress_phase(MG_PH_SYNC);
    if (t->hooks.reduce_grads) {
        rc = t->hooks.reduce_grads(t->hooks.ctx, m->grad_buf, m->nparams);
        if (rc < 0)
            return rc;
    }
    mg_progress_phase(MG_PH_OPTIMIZER);
    if (fused || sharded) /* the update is done */
        t->opt.steps++;
    else
        mg_optim_step(&t->opt, m->param_buf, m->grad_buf, st->lr);
    t->step++;
    rc = mg_backend_poll(m->be); /* no wait: what the backend has seen so far */
    mg_progress_step_end(t->step);
    return rc;
}

int mg_trainer_sums(struct mg_trainer *t, struct mg_train_sums *out, int reset)
{
    struct mg_backend *be = t->model->be;
    double acc[MG_ACC_LEN];
    memset(out, 0, sizeof(*out));
    be->ops->download(be, acc, t->acc, sizeof(acc));
    t->readbacks++;
    int rc = mg_backend_poll(be);
    if (rc < 0)
        return rc;
    out->loss_sum = acc[MG_ACC_TOTAL];
    out->correct = (long)acc[MG_ACC_CORRECT];
    out->samples = t->sum_samples;
    out->steps = t->sum_steps;
    out->bad_step = (long)acc[MG_ACC_BAD_STEP];
    out->bad_loss = acc[MG_ACC_BAD_LOSS];
    if (reset) {
        be->ops->zero(be, t->acc, sizeof(acc));
        t->sum_samples = t->sum_steps = 0;
    }
    return 0;
}

int mg_trainer_evaluate(struct mg_trainer *t, struct mg_eval_sums *out)
{
    struct mg_model *m = t->model;
    double sums[3] = {0, 0, 0};
    memset(out, 0, sizeof(*out));
    if (!t->test)
        return -EINVAL;
    const struct mg_sampler *s = &t->eval_sampler;
    struct mg_backend *be = m->be;
    double *acc = t->acc + MG_ACC_LEN, host[MG_ACC_LEN];
    mg_progress_phase(MG_PH_EVAL);
    be->ops->zero(be, acc, sizeof(host));
    for (int start = 0; start < s->num_samples; start += m->max_batch) {
        mg_progress_beat();
        int n = s->num_samples - start < m->max_batch ? s->num_samples - start : m->max_batch;
        upload_batch(t, t->test, s->indices + start, n);
        mg_model_forward(m, n, 0);
        /* a batch per "step": its sum added to the total, as the host added them */
        mg_model_loss_queue(m, n, acc, 1, start / m->max_batch + 1);
        sums[2] += n;
    }
    slot_used(t, t->cur); /* evaluation read the current slot's buffers last */
    be->ops->download(be, host, acc, sizeof(host));
    int rc = mg_backend_poll(be);
    if (rc < 0)
        return rc;
    sums[0] = host[MG_ACC_TOTAL];
    sums[1] = host[MG_ACC_CORRECT];
    if (t->hooks.reduce_sums) {
        rc = t->hooks.reduce_sums(t->hooks.ctx, sums, 3);
        if (rc < 0)
            return rc;
    }
    out->loss_sum = sums[0];
    out->correct = (long)sums[1];
    out->count = (long)sums[2];
    return 0;
}
