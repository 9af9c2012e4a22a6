/* Models as sequences of layers over flat buffers (see model.h): shape
 * inference, buffer layout, PyTorch-default initialization, forward, and a
 * backward that reports each layer's finished gradient range. */
#include "model.h"
#include "mg_err.h"
#include "rtutil.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Caps: a model bigger than this is a configuration mistake, not a workload. */
#define MAX_PARAMS ((size_t)1 << 32)
#define MAX_ARENA  ((size_t)64 << 30)

static void conv_dims(const struct mg_layer *l, int n, struct mg_conv2d_dims *d)
{
    *d = (struct mg_conv2d_dims){
        .n = n,
        .c = l->in_dims[0],
        .h = l->in_dims[1],
        .w = l->in_dims[2],
        .oc = l->spec.out,
        .kh = l->spec.kernel,
        .kw = l->spec.kernel,
        .stride = l->spec.stride ? l->spec.stride : 1,
        .pad = l->spec.padding,
    };
    mg_conv2d_dims_finish(d);
}

static void pool_dims(const struct mg_layer *l, int n, struct mg_pool2d_dims *d)
{
    *d = (struct mg_pool2d_dims){
        .n = n,
        .c = l->in_dims[0],
        .h = l->in_dims[1],
        .w = l->in_dims[2],
        .k = l->spec.kernel,
        .stride = l->spec.stride ? l->spec.stride : l->spec.kernel,
    };
    mg_pool2d_dims_finish(d);
}

/* The index of the new tensor, or -MG_ETOOBIG past MG_MAX_TENSORS. */
static int add_tensor(struct mg_model *m, int layer, const char *what, int ndim, const int *shape)
{
    if (m->ntensors >= MG_MAX_TENSORS)
        return -MG_ETOOBIG;
    struct mg_tensor *t = &m->params[m->ntensors];
    snprintf(t->name, sizeof(t->name), "%d.%s", layer, what);
    t->ndim = ndim;
    t->numel = 1;
    for (int i = 0; i < ndim; i++) {
        t->shape[i] = shape[i];
        t->numel *= (size_t)shape[i];
    }
    t->offset = m->nparams;
    m->nparams += t->numel;
    return m->ntensors++;
}

/* Per-sample output shape and parameters of each layer. */
static int infer_shapes(struct mg_model *m, char *err)
{
    int dims[3] = {m->in_dims[0], m->in_dims[1], m->in_dims[2]};
    int seen_params = 0;
    for (int i = 0; i < m->nlayers; i++) {
        struct mg_layer *l = &m->layers[i];
        const struct mg_layer_spec *s = &l->spec;
        memcpy(l->in_dims, dims, sizeof(dims));
        l->weight = l->bias = -1;
        l->need_dx = seen_params;
        switch (s->kind) {
        case MG_LAYER_LINEAR: {
            if (dims[1] != 1 || dims[2] != 1)
                return mg_seterr(err, MG_ERRMSG_LEN, -MG_ESHAPE,
                                 "layer %d (linear): input is %dx%dx%d; add a flatten before it", i,
                                 dims[0], dims[1], dims[2]);
            if (s->out <= 0)
                return mg_seterr(err, MG_ERRMSG_LEN, -EINVAL,
                                 "layer %d (linear): out_features must be > 0", i);
            int ws[2] = {s->out, dims[0]}, bs[1] = {s->out};
            l->param_offset = m->nparams;
            l->weight = add_tensor(m, i, "weight", 2, ws);
            l->bias = add_tensor(m, i, "bias", 1, bs);
            dims[0] = s->out;
            break;
        }
        case MG_LAYER_CONV2D: {
            struct mg_conv2d_dims d;
            conv_dims(l, 1, &d);
            if (s->out <= 0 || s->kernel <= 0 || s->stride < 0 || mg_conv2d_dims_finish(&d) < 0)
                return mg_seterr(err, MG_ERRMSG_LEN, -MG_ESHAPE,
                                 "layer %d (conv2d): kernel %d stride %d padding %d does not fit "
                                 "input %dx%dx%d",
                                 i, s->kernel, d.stride, s->padding, dims[0], dims[1], dims[2]);
            int ws[4] = {s->out, dims[0], s->kernel, s->kernel}, bs[1] = {s->out};
            l->param_offset = m->nparams;
            l->weight = add_tensor(m, i, "weight", 4, ws);
            l->bias = add_tensor(m, i, "bias", 1, bs);
            dims[0] = d.oc;
            dims[1] = d.oh;
            dims[2] = d.ow;
            break;
        }
        case MG_LAYER_MAXPOOL2D: {
            struct mg_pool2d_dims d;
            pool_dims(l, 1, &d);
            if (s->kernel <= 0 || s->stride < 0 || mg_pool2d_dims_finish(&d) < 0)
                return mg_seterr(err, MG_ERRMSG_LEN, -MG_ESHAPE,
                                 "layer %d (maxpool2d): kernel %d does not fit input %dx%dx%d", i,
                                 s->kernel, dims[0], dims[1], dims[2]);
            dims[1] = d.oh;
            dims[2] = d.ow;
            break;
        }
        case MG_LAYER_FLATTEN:
            dims[0] = dims[0] * dims[1] * dims[2];
            dims[1] = dims[2] = 1;
            break;
        case MG_LAYER_DROPOUT:
            if (!(s->p >= 0.0f && s->p < 1.0f))
                return mg_seterr(err, MG_ERRMSG_LEN, -EINVAL,
                                 "layer %d (dropout): p must be in [0, 1)", i);
            break;
        case MG_LAYER_RELU:
            break;
        default:
            return mg_seterr(err, MG_ERRMSG_LEN, -EINVAL, "layer %d: unknown kind %d", i,
                             (int)s->kind);
        }
        if ((s->kind == MG_LAYER_LINEAR || s->kind == MG_LAYER_CONV2D) &&
            (l->weight < 0 || l->bias < 0))
            return mg_seterr(err, MG_ERRMSG_LEN, l->weight < 0 ? l->weight : l->bias,
                             "too many parameter tensors (max %d)", MG_MAX_TENSORS);
        if (l->weight >= 0) {
            l->param_count = m->nparams - l->param_offset;
            seen_params = 1;
        }
        memcpy(l->out_dims, dims, sizeof(dims));
        l->in_size = (size_t)l->in_dims[0] * l->in_dims[1] * l->in_dims[2];
        l->out_size = (size_t)dims[0] * dims[1] * dims[2];
        if (m->nparams > MAX_PARAMS)
            return mg_seterr(err, MG_ERRMSG_LEN, -MG_ETOOBIG, "model has over %zu parameters",
                             MAX_PARAMS);
    }
    if (dims[0] != m->classes || dims[1] != 1 || dims[2] != 1)
        return mg_seterr(err, MG_ERRMSG_LEN, -MG_ESHAPE,
                         "the last layer gives %dx%dx%d values, not %d classes", dims[0], dims[1],
                         dims[2], m->classes);
    return 0;
}

static void fuse(struct mg_model *m)
{
    for (int i = 1; i < m->nlayers; i++) {
        struct mg_layer *prev = &m->layers[i - 1], *l = &m->layers[i];
        if (l->spec.kind == MG_LAYER_RELU && !prev->fused &&
            (prev->spec.kind == MG_LAYER_LINEAR || prev->spec.kind == MG_LAYER_CONV2D)) {
            prev->fused_relu = 1;
            l->fused = 1;
        }
    }
}

/* A conv whose output (after an optional ReLU) goes into a non-overlapping max-pool
 * receives a gradient with at most one nonzero per window. */
static void mark_sparse(struct mg_model *m)
{
    for (int i = 0; i < m->nlayers; i++) {
        struct mg_layer *l = &m->layers[i];
        if (l->spec.kind != MG_LAYER_CONV2D)
            continue;
        int j = i + 1;
        if (j < m->nlayers && m->layers[j].spec.kind == MG_LAYER_RELU)
            j++;
        if (j < m->nlayers && m->layers[j].spec.kind == MG_LAYER_MAXPOOL2D) {
            const struct mg_layer_spec *p = &m->layers[j].spec;
            int stride = p->stride ? p->stride : p->kernel;
            l->sparse_dy = stride >= p->kernel && p->kernel >= 2;
        }
    }
}

static size_t take(size_t *off, size_t bytes)
{
    size_t at = (*off + 63) & ~(size_t)63;
    *off = at + bytes;
    return at;
}

/* Offsets of every activation buffer in the arena (first pass), then the
 * pointers once it is allocated (second pass, base != NULL). */
static size_t layout_arena(struct mg_model *m, char *base)
{
    size_t off = 0, B = (size_t)m->max_batch, dmax = 0, scratch = 0;
    size_t in_size = (size_t)m->in_dims[0] * m->in_dims[1] * m->in_dims[2];
#define PLACE(ptr, type, bytes)                                                                    \
    do {                                                                                           \
        size_t at_ = take(&off, (bytes));                                                          \
        if (base)                                                                                  \
            ptr = (type)(void *)(base + at_);                                                      \
    } while (0)
    PLACE(m->input, float *, B *in_size * sizeof(float));
    PLACE(m->labels, int32_t *, B * sizeof(int32_t));
    PLACE(m->probs, float *, B * m->classes * sizeof(float));
    PLACE(m->losses, float *, B * sizeof(float));
    PLACE(m->correct, int32_t *, B * sizeof(int32_t));
    for (int i = 0; i < m->nlayers; i++) {
        struct mg_layer *l = &m->layers[i];
        size_t n = B * l->out_size;
        size_t big = l->in_size > l->out_size ? l->in_size : l->out_size;
        if (B * big > dmax)
            dmax = B * big;
        switch (l->spec.kind) {
        case MG_LAYER_LINEAR:
        case MG_LAYER_DROPOUT:
            if (l->spec.kind == MG_LAYER_LINEAR) {
                size_t s =
                    m->be->ops->linear_scratch(m->be, m->max_batch, (int)l->in_size, l->spec.out);
                if (s > scratch)
                    scratch = s;
            }
            PLACE(l->out, float *, n * sizeof(float));
            if (l->spec.kind == MG_LAYER_DROPOUT)
                PLACE(l->mask, uint8_t *, n);
            break;
        case MG_LAYER_CONV2D: {
            struct mg_conv2d_dims d;
            conv_dims(l, m->max_batch, &d);
            size_t s = m->be->ops->conv2d_scratch(m->be, &d);
            if (s > scratch)
                scratch = s;
            PLACE(l->out, float *, n * sizeof(float));
            break;
        }
        case MG_LAYER_MAXPOOL2D:
            PLACE(l->out, float *, n * sizeof(float));
            PLACE(l->pool_idx, int32_t *, n * sizeof(int32_t));
            break;
        case MG_LAYER_RELU:
            if (!l->fused)
                PLACE(l->out, float *, n * sizeof(float));
            break;
        case MG_LAYER_FLATTEN:
            break;
        }
    }
    PLACE(m->dbuf[0], float *, dmax * sizeof(float));
    PLACE(m->dbuf[1], float *, dmax * sizeof(float));
    PLACE(m->scratch, void *, scratch);
#undef PLACE
    return off;
}

int mg_model_init(struct mg_model *m, struct mg_backend *be, const char *name, const int in_dims[3],
                  int classes, const struct mg_layer_spec *specs, int nspecs, int max_batch,
                  char *err)
{
    int rc;
    memset(m, 0, sizeof(*m));
    m->be = be;
    snprintf(m->name, sizeof(m->name), "%s", name);
    if (nspecs <= 0 || nspecs > MG_MAX_LAYERS)
        return mg_seterr(err, MG_ERRMSG_LEN, -EINVAL, "a model has 1 to %d layers, not %d",
                         MG_MAX_LAYERS, nspecs);
    if (max_batch <= 0 || classes <= 0 || in_dims[0] <= 0 || in_dims[1] <= 0 || in_dims[2] <= 0)
        return mg_seterr(err, MG_ERRMSG_LEN, -EINVAL, "bad batch size, class count or input shape");
    memcpy(m->in_dims, in_dims, sizeof(m->in_dims));
    m->classes = classes;
    m->max_batch = max_batch;
    m->nlayers = nspecs;
    for (int i = 0; i < nspecs; i++)
        m->layers[i].spec = specs[i];
    rc = infer_shapes(m, err);
    if (rc < 0)
        return rc;
    fuse(m);
    mark_sparse(m);
    m->arena_bytes = layout_arena(m, NULL);
    if (m->arena_bytes > MAX_ARENA)
        return mg_seterr(err, MG_ERRMSG_LEN, -MG_ETOOBIG, "activations for batch %d need %zu bytes",
                         max_batch, m->arena_bytes);

    rc = -ENOMEM;
    m->param_buf = be->ops->alloc(be, m->nparams * sizeof(float));
    if (!m->param_buf)
        goto fail;
    m->grad_buf = be->ops->alloc(be, m->nparams * sizeof(float));
    if (!m->grad_buf)
        goto fail;
    m->arena = be->ops->alloc(be, m->arena_bytes);
    if (!m->arena)
        goto fail;
    m->host_losses = calloc((size_t)max_batch, sizeof(float));
    m->host_correct = calloc((size_t)max_batch, sizeof(int32_t));
    if (!m->host_losses || !m->host_correct)
        goto fail;
    layout_arena(m, m->arena);
    for (int t = 0; t < m->ntensors; t++) {
        m->params[t].data = m->param_buf + m->params[t].offset;
        m->grads[t] = m->params[t];
        m->grads[t].data = m->grad_buf + m->params[t].offset;
    }
    return 0;
fail:
    mg_model_release(m);
    return mg_seterr(err, MG_ERRMSG_LEN, rc,
                     "out of memory for a model of %zu parameters, batch %d", m->nparams,
                     max_batch);
}

void mg_model_release(struct mg_model *m)
{
    if (!m->be)
        return;
    if (m->param_buf)
        m->be->ops->free(m->be, m->param_buf);
    if (m->grad_buf)
        m->be->ops->free(m->be, m->grad_buf);
    if (m->arena)
        m->be->ops->free(m->be, m->arena);
    free(m->host_losses);
    free(m->host_correct);
    memset(m, 0, sizeof(*m));
}

int mg_model_init_params(struct mg_model *m, uint64_t seed)
{
    float *host = malloc(m->nparams * sizeof(float) + 1);
    if (!host)
        return -ENOMEM;
    struct mg_mt19937 g;
    mg_mt19937_seed(&g, seed);
    /* nn.Linear / nn.Conv2d reset_parameters(), in construction order:
     * kaiming_uniform_(w, a=sqrt(5)) then uniform_(b, +-1/sqrt(fan_in)),
     * with the bounds computed in double as Python does. */
    for (int i = 0; i < m->nlayers; i++) {
        const struct mg_layer *l = &m->layers[i];
        if (l->weight < 0)
            continue;
        const struct mg_tensor *w = &m->params[l->weight];
        size_t fan_in = w->numel / (size_t)w->shape[0];
        double a = sqrt(5.0);
        double gain = sqrt(2.0 / (1.0 + a * a));
        double bound = sqrt(3.0) * (gain / sqrt((double)fan_in));
        mg_rng_uniform(&g, host + w->offset, w->numel, -bound, bound);
        if (l->bias >= 0) {
            const struct mg_tensor *b = &m->params[l->bias];
            double bb = 1.0 / sqrt((double)fan_in);
            mg_rng_uniform(&g, host + b->offset, b->numel, -bb, bb);
        }
    }
    mg_model_set_params(m, host);
    free(host);
    return m->be->ops->sync(m->be);
}

void mg_model_set_params(struct mg_model *m, const float *host)
{
    m->be->ops->upload(m->be, m->param_buf, host, m->nparams * sizeof(float));
}

void mg_model_get_params(const struct mg_model *m, float *host)
{
    m->be->ops->download(m->be, host, m->param_buf, m->nparams * sizeof(float));
}

void mg_model_get_grads(const struct mg_model *m, float *host)
{
    m->be->ops->download(m->be, host, m->grad_buf, m->nparams * sizeof(float));
}

void mg_model_tensor_record(const struct mg_tensor *t, unsigned char rec[MG_TENSOR_REC_BYTES])
{
    memset(rec, 0, MG_TENSOR_REC_BYTES);
    memcpy(rec, t->name, strnlen(t->name, MG_NAME_MAX - 1));
    mg_put_u32(rec + MG_NAME_MAX, (uint32_t)t->ndim);
    for (int k = 0; k < t->ndim && k < MG_MAX_DIMS; k++)
        mg_put_u32(rec + MG_NAME_MAX + 4 + 4 * k, (uint32_t)t->shape[k]);
}

float *mg_model_swap_grad_buf(struct mg_model *m, float *buf)
{
    float *old = m->grad_buf;
    if (!buf || buf == old)
        return old;
    m->be->ops->copy(m->be, buf, old, m->nparams * sizeof(float));
    m->grad_buf = buf;
    for (int t = 0; t < m->ntensors; t++)
        m->grads[t].data = buf + m->params[t].offset;
    return old;
}

float *mg_model_swap_param_buf(struct mg_model *m, float *buf)
{
    float *old = m->param_buf;
    if (!buf || buf == old)
        return old;
    m->be->ops->copy(m->be, buf, old, m->nparams * sizeof(float));
    m->param_buf = buf;
    for (int t = 0; t < m->ntensors; t++)
        m->params[t].data = buf + m->params[t].offset;
    return old;
}

void mg_model_zero_grad(struct mg_model *m)
{
    m->be->ops->zero(m->be, m->grad_buf, m->nparams * sizeof(float));
}

static const float *tensor_data(const struct mg_model *m, int t)
{
    return t >= 0 ? m->params[t].data : NULL;
}

void mg_model_forward(struct mg_model *m, int n, int train)
{
    struct mg_backend *be = m->be;
    const float *x = m->input;
    for (int i = 0; i < m->nlayers; i++) {
        struct mg_layer *l = &m->layers[i];
        float *y = l->out;
        size_t cnt = (size_t)n * l->out_size;
        l->x = x;
        l->dropped = 0;
        switch (l->spec.kind) {
        case MG_LAYER_LINEAR:
            be->ops->linear_forward(be, y, x, tensor_data(m, l->weight), tensor_data(m, l->bias), n,
                                    (int)l->in_size, l->spec.out, l->fused_relu);
            break;
        case MG_LAYER_CONV2D: {
            struct mg_conv2d_dims d;
            conv_dims(l, n, &d);
            be->ops->conv2d_forward(be, &d, y, x, tensor_data(m, l->weight),
                                    tensor_data(m, l->bias), l->fused_relu, m->scratch);
            break;
        }
        case MG_LAYER_MAXPOOL2D: {
            struct mg_pool2d_dims d;
            pool_dims(l, n, &d);
            be->ops->maxpool2d_forward(be, &d, y, l->pool_idx, x);
            break;
        }
        case MG_LAYER_RELU:
            if (l->fused)
                y = (float *)x;
            else
                be->ops->relu_forward(be, y, x, cnt);
            break;
        case MG_LAYER_FLATTEN:
            y = (float *)x;
            break;
        case MG_LAYER_DROPOUT:
            if (train && l->spec.p > 0.0f) {
                be->ops->dropout_forward(be, y, l->mask, x, cnt, l->spec.p, m->dropout_rng.seed,
                                         m->dropout_rng.offset);
                m->dropout_rng.offset += cnt;
                l->dropped = 1;
            } else {
                y = (float *)x;
            }
            break;
        }
        l->y = y;
        x = y;
    }
    m->logits = (float *)x;
}

int mg_model_loss(struct mg_model *m, int n, double *loss_sum, long *correct)
{
    struct mg_backend *be = m->be;
    be->ops->xent_forward(be, m->losses, m->correct, m->probs, m->logits, m->labels, n, m->classes);
    be->ops->download(be, m->host_losses, m->losses, (size_t)n * sizeof(float));
    be->ops->download(be, m->host_correct, m->correct, (size_t)n * sizeof(int32_t));
    int rc = be->ops->sync(be);
    double s = 0.0;
    long c = 0;
    for (int i = 0; i < n; i++) {
        s += m->host_losses[i];
        c += m->host_correct[i];
    }
    if (loss_sum)
        *loss_sum = s;
    if (correct)
        *correct = c;
    return rc;
}

void mg_model_loss_queue(struct mg_model *m, int n, double *acc, int close, int64_t step)
{
    struct mg_backend *be = m->be;
    be->ops->xent_forward(be, m->losses, m->correct, m->probs, m->logits, m->labels, n, m->classes);
    be->ops->loss_accumulate(be, acc, m->losses, m->correct, n, close, step);
}

int mg_model_backward(struct mg_model *m, int n, float scale, int accumulate,
                      int (*ready)(void *ctx, size_t offset, size_t count), void *ctx)
{
    struct mg_backend *be = m->be;
    float *d = m->dbuf[0];
    be->ops->xent_backward(be, d, m->probs, m->labels, n, m->classes, scale);
    for (int i = m->nlayers - 1; i >= 0; i--) {
        struct mg_layer *l = &m->layers[i];
        if (!l->need_dx && l->weight < 0)
            break; /* nothing before this point has parameters */
        float *other = d == m->dbuf[0] ? m->dbuf[1] : m->dbuf[0];
        float *dx = l->need_dx ? other : NULL;
        size_t cnt = (size_t)n * l->out_size;
        switch (l->spec.kind) {
        case MG_LAYER_LINEAR:
            if (l->fused_relu)
                be->ops->relu_backward(be, d, d, l->y, cnt);
            be->ops->linear_backward(be, dx, m->grads[l->weight].data, m->grads[l->bias].data, d,
                                     l->x, m->params[l->weight].data, n, (int)l->in_size,
                                     l->spec.out, accumulate, m->scratch);
            break;
        case MG_LAYER_CONV2D: {
            struct mg_conv2d_dims cd;
            conv_dims(l, n, &cd);
            be->ops->conv2d_backward(be, &cd, dx, m->grads[l->weight].data, m->grads[l->bias].data,
                                     d, l->x, m->params[l->weight].data, l->y, l->fused_relu,
                                     accumulate, l->sparse_dy, m->scratch);
            break;
        }
        case MG_LAYER_MAXPOOL2D: {
            struct mg_pool2d_dims pd;
            pool_dims(l, n, &pd);
            if (dx)
                be->ops->maxpool2d_backward(be, &pd, dx, d, l->pool_idx);
            break;
        }
        case MG_LAYER_RELU:
            dx = d;
            if (!l->fused)
                be->ops->relu_backward(be, dx, d, l->y, cnt);
            break;
        case MG_LAYER_FLATTEN:
            dx = d;
            break;
        case MG_LAYER_DROPOUT:
            dx = d;
            if (l->dropped)
                be->ops->dropout_backward(be, dx, d, l->mask, cnt, l->spec.p);
            break;
        }
        if (l->weight >= 0 && ready) {
            int rc = ready(ctx, l->param_offset, l->param_count);
            if (rc < 0)
                return rc;
        }
        if (dx)
            d = dx;
    }
    return mg_backend_poll(be);
}

uint64_t mg_model_param_hash(const struct mg_model *m)
{
    size_t bytes = m->nparams * sizeof(float);
    if (m->be->device == MG_DEVICE_CPU)
        return mg_hash64(m->param_buf, bytes);
    float *host = malloc(bytes + 1);
    if (!host)
        return 0;
    mg_model_get_params(m, host);
    uint64_t h = mg_hash64(host, bytes);
    free(host);
    return h;
}
