/* cuDNN for the CUDA backend's convolutions: descriptors and algorithms,
 * chosen once per shape (cuda_internal.h), and cuDNN's own output-shape
 * arithmetic. The legacy API (deprecated in cuDNN 9 but present; the
 * deprecation warnings are off unless CUDNN_WARN_DEPRECATED is defined) is
 * kept to this file, so moving to the graph API later stays local.
 *
 * Algorithms come from cudnnGet*Algorithm_v7 (heuristics: no benchmark, no
 * allocation, so a new shape in the step loop costs host time only): the
 * first one that is deterministic, uses FMA math (no TF32, unless the
 * backend's precision allows it) and whose workspace fits the budget. */
#include "cuda_internal.h"

#include <cudnn.h>
#include <errno.h>
#include <string.h>

/* The most workspace one convolution may take when conv2d_scratch sizes it. */
#define CONV_WS_MAX ((size_t)256 << 20)
#define ALIGN(x)    (((x) + 255) & ~(size_t)255)

static int same_shape(const struct mg_conv2d_dims *a, const struct mg_conv2d_dims *b, int with_n)
{
    return (!with_n || a->n == b->n) && a->c == b->c && a->h == b->h && a->w == b->w &&
           a->oc == b->oc && a->kh == b->kh && a->kw == b->kw && a->stride == b->stride &&
           a->pad == b->pad;
}

static void conv_destroy(struct mgcu_conv *e)
{
    if (e->x)
        cudnnDestroyTensorDescriptor(e->x);
    if (e->y)
        cudnnDestroyTensorDescriptor(e->y);
    if (e->w)
        cudnnDestroyFilterDescriptor(e->w);
    if (e->conv)
        cudnnDestroyConvolutionDescriptor(e->conv);
    memset(e, 0, sizeof(*e));
}

void mgcu_convs_release(struct mgcu_convs *c)
{
    for (int i = 0; i < c->n; i++)
        conv_destroy(&c->e[i]);
    c->n = 0;
}

/* Descriptors for d, checking that cuDNN's output shape is ours. */
static int make_descriptors(struct mgcu_conv *e, const struct mg_conv2d_dims *d,
                            enum mg_precision precision, struct mgcu_err *err)
{
    int n, c, h, w;
    e->d = *d;
    if (CUDNN_FAILED(err, cudnnCreateTensorDescriptor(&e->x)) ||
        CUDNN_FAILED(err, cudnnCreateTensorDescriptor(&e->y)) ||
        CUDNN_FAILED(err, cudnnCreateFilterDescriptor(&e->w)) ||
        CUDNN_FAILED(err, cudnnCreateConvolutionDescriptor(&e->conv)) ||
        CUDNN_FAILED(err, cudnnSetTensor4dDescriptor(e->x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT,
                                                     d->n, d->c, d->h, d->w)) ||
        CUDNN_FAILED(err, cudnnSetFilter4dDescriptor(e->w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW,
                                                     d->oc, d->c, d->kh, d->kw)) ||
        /* PyTorch's Conv2d is a cross-correlation */
        CUDNN_FAILED(err, cudnnSetConvolution2dDescriptor(e->conv, d->pad, d->pad, d->stride,
                                                          d->stride, 1, 1, CUDNN_CROSS_CORRELATION,
                                                          CUDNN_DATA_FLOAT)) ||
        CUDNN_FAILED(err, cudnnSetConvolutionMathType(e->conv, precision == MG_PRECISION_TF32
                                                                   ? CUDNN_DEFAULT_MATH
                                                                   : CUDNN_FMA_MATH)) ||
        CUDNN_FAILED(err,
                     cudnnGetConvolution2dForwardOutputDim(e->conv, e->x, e->w, &n, &c, &h, &w)))
        return -1;
    if (n != d->n || c != d->oc || h != d->oh || w != d->ow) {
        mgcu_fail(err, -MG_ESHAPE,
                  "cuDNN makes the convolution %dx%dx%dx%d -> %dx%dx%dx%d, mg %dx%dx%dx%d", d->n,
                  d->c, d->h, d->w, n, c, h, w, d->n, d->oc, d->oh, d->ow);
        return -1;
    }
    if (CUDNN_FAILED(
            err, cudnnSetTensor4dDescriptor(e->y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, n, c, h, w)))
        return -1;
    return 0;
}

static int math_allowed(cudnnMathType_t m, enum mg_precision precision)
{
    return precision == MG_PRECISION_TF32 || m == CUDNN_FMA_MATH;
}

static void conv_text(const struct mg_conv2d_dims *d, char *buf, size_t len)
{
    snprintf(buf, len, "%dx%dx%dx%d * %dx%dx%dx%d (stride %d, pad %d)", d->n, d->c, d->h, d->w,
             d->oc, d->c, d->kh, d->kw, d->stride, d->pad);
}

/* The three algorithms for e, within limit bytes of workspace. */
static int choose(struct mgcu_backend *b, struct mgcu_conv *e, size_t limit)
{
    cudnnConvolutionFwdAlgoPerf_t fwd[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    cudnnConvolutionBwdDataAlgoPerf_t bd[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    cudnnConvolutionBwdFilterAlgoPerf_t bf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    struct mgcu_err *err = &b->err;
    char what[128];
    int nf = 0, nd = 0, nw = 0, i;
    size_t ws, most = 0;

    conv_text(&e->d, what, sizeof(what));
    if (CUDNN_FAILED(err, cudnnGetConvolutionForwardAlgorithm_v7(b->dnn, e->x, e->w, e->conv, e->y,
                                                                 CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
                                                                 &nf, fwd)))
        return -1;
    for (i = 0; i < nf; i++)
        if (fwd[i].status == CUDNN_STATUS_SUCCESS && fwd[i].determinism == CUDNN_DETERMINISTIC &&
            math_allowed(fwd[i].mathType, b->precision) &&
            cudnnGetConvolutionForwardWorkspaceSize(b->dnn, e->x, e->w, e->conv, e->y, fwd[i].algo,
                                                    &ws) == CUDNN_STATUS_SUCCESS &&
            ws <= limit)
            break;
    if (i == nf) {
        mgcu_fail(err, -MG_EUNSUPPORTED,
                  "cuDNN has no deterministic forward algorithm for the convolution %s within "
                  "%zu bytes of workspace",
                  what, limit);
        return -1;
    }
    e->fwd = fwd[i].algo;
    most = ws > most ? ws : most;

    if (CUDNN_FAILED(err, cudnnGetConvolutionBackwardDataAlgorithm_v7(
                              b->dnn, e->w, e->y, e->conv, e->x,
                              CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &nd, bd)))
        return -1;
    for (i = 0; i < nd; i++)
        if (bd[i].status == CUDNN_STATUS_SUCCESS && bd[i].determinism == CUDNN_DETERMINISTIC &&
            math_allowed(bd[i].mathType, b->precision) &&
            cudnnGetConvolutionBackwardDataWorkspaceSize(b->dnn, e->w, e->y, e->conv, e->x,
                                                         bd[i].algo, &ws) == CUDNN_STATUS_SUCCESS &&
            ws <= limit)
            break;
    if (i == nd) {
        mgcu_fail(err, -MG_EUNSUPPORTED,
                  "cuDNN has no deterministic backward-data algorithm for the convolution %s "
                  "within %zu bytes of workspace",
                  what, limit);
        return -1;
    }
    e->bwd_data = bd[i].algo;
    most = ws > most ? ws : most;

    if (CUDNN_FAILED(err, cudnnGetConvolutionBackwardFilterAlgorithm_v7(
                              b->dnn, e->x, e->y, e->conv, e->w,
                              CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &nw, bf)))
        return -1;
    for (i = 0; i < nw; i++)
        if (bf[i].status == CUDNN_STATUS_SUCCESS && bf[i].determinism == CUDNN_DETERMINISTIC &&
            math_allowed(bf[i].mathType, b->precision) &&
            cudnnGetConvolutionBackwardFilterWorkspaceSize(
                b->dnn, e->x, e->y, e->conv, e->w, bf[i].algo, &ws) == CUDNN_STATUS_SUCCESS &&
            ws <= limit)
            break;
    if (i == nw) {
        mgcu_fail(err, -MG_EUNSUPPORTED,
                  "cuDNN has no deterministic backward-filter algorithm for the convolution %s "
                  "within %zu bytes of workspace",
                  what, limit);
        return -1;
    }
    e->bwd_filter = bf[i].algo;
    most = ws > most ? ws : most;
    e->ws = most;
    e->partial = ALIGN(most);
    return 0;
}

/* The entry for d, made within limit bytes of scratch (workspace and partial sums). */
static struct mgcu_conv *conv_find_or_make(struct mgcu_backend *b, const struct mg_conv2d_dims *d,
                                           size_t limit)
{
    struct mgcu_convs *c = &b->convs;
    for (int i = 0; i < c->n; i++)
        if (same_shape(&c->e[i].d, d, 1))
            return &c->e[i];
    if (b->err.code)
        return NULL; /* a failed backend: no new cuDNN calls */
    struct mgcu_conv *e;
    if (c->n < MGCU_CONV_CACHE) {
        e = &c->e[c->n++];
    } else {
        e = &c->e[c->next_evict];
        c->next_evict = (c->next_evict + 1) % MGCU_CONV_CACHE;
        conv_destroy(e);
    }
    size_t partial = ALIGN((size_t)d->n * d->oc * sizeof(float));
    if (make_descriptors(e, d, b->precision, &b->err) < 0 ||
        choose(b, e, limit > partial ? limit - partial : 0) < 0) {
        conv_destroy(e);
        if (e == &c->e[c->n - 1])
            c->n--;
        return NULL;
    }
    return e;
}

size_t mgcu_conv_scratch(struct mgcu_backend *b, const struct mg_conv2d_dims *d)
{
    const struct mgcu_conv *e = conv_find_or_make(b, d, CONV_WS_MAX);
    if (!e)
        return 0;
    size_t bytes = e->partial + ALIGN((size_t)d->n * d->oc * sizeof(float));
    struct mgcu_convs *c = &b->convs;
    for (int i = 0; i < c->nbudget; i++)
        if (same_shape(&c->budget[i].d, d, 0)) {
            if (bytes > c->budget[i].bytes)
                c->budget[i].bytes = bytes;
            return c->budget[i].bytes;
        }
    if (c->nbudget < MGCU_CONV_CACHE)
        c->budget[c->nbudget++] = (struct mgcu_conv_budget){.d = *d, .bytes = bytes};
    return bytes;
}

const struct mgcu_conv *mgcu_conv_get(struct mgcu_backend *b, const struct mg_conv2d_dims *d)
{
    size_t limit = 0;
    const struct mgcu_convs *c = &b->convs;
    for (int i = 0; i < c->nbudget; i++)
        if (same_shape(&c->budget[i].d, d, 0))
            limit = c->budget[i].bytes;
    return conv_find_or_make(b, d, limit);
}

/* ---- cuDNN's shape arithmetic, alone --------------------------------------------------- */

static int status_code(cudnnStatus_t st)
{
    return st == CUDNN_STATUS_BAD_PARAM ? -EINVAL : -EIO;
}

int mgcu_conv2d_out_dims(const struct mg_conv2d_dims *d, int out[4], char *err, size_t errlen)
{
    cudnnTensorDescriptor_t x = NULL;
    cudnnFilterDescriptor_t w = NULL;
    cudnnConvolutionDescriptor_t conv = NULL;
    const char *step = "cudnnCreateTensorDescriptor";
    cudnnStatus_t st = cudnnCreateTensorDescriptor(&x);
    if (st == CUDNN_STATUS_SUCCESS && (step = "cudnnCreateFilterDescriptor"))
        st = cudnnCreateFilterDescriptor(&w);
    if (st == CUDNN_STATUS_SUCCESS && (step = "cudnnCreateConvolutionDescriptor"))
        st = cudnnCreateConvolutionDescriptor(&conv);
    if (st == CUDNN_STATUS_SUCCESS && (step = "cudnnSetTensor4dDescriptor"))
        st = cudnnSetTensor4dDescriptor(x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, d->n, d->c, d->h,
                                        d->w);
    if (st == CUDNN_STATUS_SUCCESS && (step = "cudnnSetFilter4dDescriptor"))
        st = cudnnSetFilter4dDescriptor(w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, d->oc, d->c, d->kh,
                                        d->kw);
    if (st == CUDNN_STATUS_SUCCESS && (step = "cudnnSetConvolution2dDescriptor"))
        st = cudnnSetConvolution2dDescriptor(conv, d->pad, d->pad, d->stride, d->stride, 1, 1,
                                             CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT);
    if (st == CUDNN_STATUS_SUCCESS && (step = "cudnnGetConvolution2dForwardOutputDim"))
        st = cudnnGetConvolution2dForwardOutputDim(conv, x, w, &out[0], &out[1], &out[2], &out[3]);
    if (conv)
        cudnnDestroyConvolutionDescriptor(conv);
    if (w)
        cudnnDestroyFilterDescriptor(w);
    if (x)
        cudnnDestroyTensorDescriptor(x);
    if (st != CUDNN_STATUS_SUCCESS)
        return mgcu_seterr(err, errlen, status_code(st), "%s: %s", step, cudnnGetErrorString(st));
    return 0;
}

int mgcu_pool2d_out_dims(const struct mg_pool2d_dims *d, int out[4], char *err, size_t errlen)
{
    cudnnTensorDescriptor_t x = NULL;
    cudnnPoolingDescriptor_t pool = NULL;
    const char *step = "cudnnCreateTensorDescriptor";
    cudnnStatus_t st = cudnnCreateTensorDescriptor(&x);
    if (st == CUDNN_STATUS_SUCCESS && (step = "cudnnCreatePoolingDescriptor"))
        st = cudnnCreatePoolingDescriptor(&pool);
    if (st == CUDNN_STATUS_SUCCESS && (step = "cudnnSetTensor4dDescriptor"))
        st = cudnnSetTensor4dDescriptor(x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, d->n, d->c, d->h,
                                        d->w);
    if (st == CUDNN_STATUS_SUCCESS && (step = "cudnnSetPooling2dDescriptor"))
        st = cudnnSetPooling2dDescriptor(pool, CUDNN_POOLING_MAX, CUDNN_PROPAGATE_NAN, d->k, d->k,
                                         0, 0, d->stride, d->stride);
    if (st == CUDNN_STATUS_SUCCESS && (step = "cudnnGetPooling2dForwardOutputDim"))
        st = cudnnGetPooling2dForwardOutputDim(pool, x, &out[0], &out[1], &out[2], &out[3]);
    if (pool)
        cudnnDestroyPoolingDescriptor(pool);
    if (x)
        cudnnDestroyTensorDescriptor(x);
    if (st != CUDNN_STATUS_SUCCESS)
        return mgcu_seterr(err, errlen, status_code(st), "%s: %s", step, cudnnGetErrorString(st));
    return 0;
}
