/* cuDNN for the CUDA backend's convolutions: descriptors and algorithms,
 * chosen once per shape (cuda_internal.h), and cuDNN's own output-shape
 * arithmetic. The legacy API (deprecated in cuDNN 9 but present; the
 * deprecation warnings are off unless CUDNN_WARN_DEPRECATED is defined) is
 * kept to this file, so moving to the graph API later stays local.
 *
 * Algorithms come from cudnnGet*Algorithm_v7 (heuristics: no benchmark, no
 * allocation, so a new shape in the step loop costs host time only): the
 * first one that is deterministic, uses FMA math (no TF32, unless the
 * backend's precision allows it) and whose workspace fits the budget. One
 * that fails when it runs gives way to the next, once (cuda_algo.h). */
#include "cuda_algo.h"
#include "cuda_internal.h"

#include <cudnn.h>
#include <errno.h>
#include <string.h>

_Static_assert(MGCU_MATH_DEFAULT == CUDNN_DEFAULT_MATH && MGCU_MATH_FMA == CUDNN_FMA_MATH,
               "cuda_algo.h's math types are cuDNN's");
_Static_assert(CUDNN_CONVOLUTION_FWD_ALGO_COUNT <= MGCU_ALGO_MAX &&
                   CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT <= MGCU_ALGO_MAX &&
                   CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT <= MGCU_ALGO_MAX,
               "every cuDNN algorithm fits in a list");

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

static void conv_text(const struct mg_conv2d_dims *d, char *buf, size_t len)
{
    snprintf(buf, len, "%dx%dx%dx%d * %dx%dx%dx%d (stride %d, pad %d)", d->n, d->c, d->h, d->w,
             d->oc, d->c, d->kh, d->kw, d->stride, d->pad);
}

/* One perf entry into the list, with its workspace size (ws_st: cuDNN's answer for it). */
static void algo_add(struct mgcu_algos *l, int algo, cudnnStatus_t st, cudnnDeterminism_t det,
                     cudnnMathType_t math, cudnnStatus_t ws_st, size_t ws)
{
    if (l->n >= MGCU_ALGO_MAX)
        return;
    l->a[l->n++] =
        (struct mgcu_algo){.algo = algo,
                           .math = (int)math,
                           .ws = ws,
                           .ok = st == CUDNN_STATUS_SUCCESS && ws_st == CUDNN_STATUS_SUCCESS,
                           .deterministic = det == CUDNN_DETERMINISTIC};
}

/* The algorithm of l to use within limit, or an error naming the direction. */
static int algo_choose(struct mgcu_backend *b, struct mgcu_algos *l, size_t limit,
                       const char *direction, const char *what, size_t *most)
{
    l->at = mgcu_algo_pick(l, b->precision == MG_PRECISION_TF32, limit);
    if (l->at < 0) {
        mgcu_fail(&b->err, -MG_EUNSUPPORTED,
                  "cuDNN has no deterministic %s algorithm for the convolution %s within %zu "
                  "bytes of workspace",
                  direction, what, limit);
        return -1;
    }
    if (l->a[l->at].ws > *most)
        *most = l->a[l->at].ws;
    return 0;
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
    cudnnStatus_t st;

    conv_text(&e->d, what, sizeof(what));
    if (CUDNN_FAILED(err, cudnnGetConvolutionForwardAlgorithm_v7(b->dnn, e->x, e->w, e->conv, e->y,
                                                                 CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
                                                                 &nf, fwd)))
        return -1;
    memset(&e->fwd, 0, sizeof(e->fwd));
    for (i = 0; i < nf; i++) {
        ws = 0;
        st = fwd[i].status == CUDNN_STATUS_SUCCESS
                 ? cudnnGetConvolutionForwardWorkspaceSize(b->dnn, e->x, e->w, e->conv, e->y,
                                                           fwd[i].algo, &ws)
                 : fwd[i].status;
        algo_add(&e->fwd, fwd[i].algo, fwd[i].status, fwd[i].determinism, fwd[i].mathType, st, ws);
    }
    if (algo_choose(b, &e->fwd, limit, "forward", what, &most) < 0)
        return -1;

    if (CUDNN_FAILED(err, cudnnGetConvolutionBackwardDataAlgorithm_v7(
                              b->dnn, e->w, e->y, e->conv, e->x,
                              CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &nd, bd)))
        return -1;
    memset(&e->bwd_data, 0, sizeof(e->bwd_data));
    for (i = 0; i < nd; i++) {
        ws = 0;
        st = bd[i].status == CUDNN_STATUS_SUCCESS
                 ? cudnnGetConvolutionBackwardDataWorkspaceSize(b->dnn, e->w, e->y, e->conv, e->x,
                                                                bd[i].algo, &ws)
                 : bd[i].status;
        algo_add(&e->bwd_data, bd[i].algo, bd[i].status, bd[i].determinism, bd[i].mathType, st, ws);
    }
    if (algo_choose(b, &e->bwd_data, limit, "backward-data", what, &most) < 0)
        return -1;

    if (CUDNN_FAILED(err, cudnnGetConvolutionBackwardFilterAlgorithm_v7(
                              b->dnn, e->x, e->y, e->conv, e->w,
                              CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &nw, bf)))
        return -1;
    memset(&e->bwd_filter, 0, sizeof(e->bwd_filter));
    for (i = 0; i < nw; i++) {
        ws = 0;
        st = bf[i].status == CUDNN_STATUS_SUCCESS
                 ? cudnnGetConvolutionBackwardFilterWorkspaceSize(b->dnn, e->x, e->y, e->conv, e->w,
                                                                  bf[i].algo, &ws)
                 : bf[i].status;
        algo_add(&e->bwd_filter, bf[i].algo, bf[i].status, bf[i].determinism, bf[i].mathType, st,
                 ws);
    }
    if (algo_choose(b, &e->bwd_filter, limit, "backward-filter", what, &most) < 0)
        return -1;
    e->ws = most;
    e->partial = ALIGN(most);
    return 0;
}

/* ---- running them ------------------------------------------------------------------------ */

enum conv_dir {
    CONV_FWD,
    CONV_BWD_DATA,
    CONV_BWD_FILTER
};

struct conv_call {
    struct mgcu_backend *b;
    struct mgcu_conv *e;
    enum conv_dir dir;
    const float *in, *w, *dy;
    float *out;
    const float *beta;
    void *scratch;
};

/* One try with algorithm a: with TF32 the descriptor takes the math type cuDNN chose the
 * algorithm for (else cuDNN would run it with the descriptor's, a slower kernel: PyTorch's
 * Conv_v7.cpp, "Note [behavior of cudnnFind and cudnnGet]"); without, it stays FMA. */
static int conv_try(void *ctx, const struct mgcu_algo *a)
{
    const struct conv_call *c = ctx;
    struct mgcu_backend *b = c->b;
    struct mgcu_conv *e = c->e;
    const float one = 1.0f;
    cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
    if (b->precision == MG_PRECISION_TF32)
        st = cudnnSetConvolutionMathType(e->conv, (cudnnMathType_t)a->math);
    if (st != CUDNN_STATUS_SUCCESS)
        return (int)st;
    switch (c->dir) {
    case CONV_FWD:
        return (int)cudnnConvolutionForward(b->dnn, &one, e->x, c->in, e->w, c->w, e->conv,
                                            (cudnnConvolutionFwdAlgo_t)a->algo, c->scratch, e->ws,
                                            c->beta, e->y, c->out);
    case CONV_BWD_DATA:
        return (int)cudnnConvolutionBackwardData(b->dnn, &one, e->w, c->w, e->y, c->dy, e->conv,
                                                 (cudnnConvolutionBwdDataAlgo_t)a->algo, c->scratch,
                                                 e->ws, c->beta, e->x, c->out);
    case CONV_BWD_FILTER:
        return (int)cudnnConvolutionBackwardFilter(b->dnn, &one, e->x, c->in, e->y, c->dy, e->conv,
                                                   (cudnnConvolutionBwdFilterAlgo_t)a->algo,
                                                   c->scratch, e->ws, c->beta, e->w, c->out);
    }
    return (int)CUDNN_STATUS_BAD_PARAM;
}

static int conv_run(struct conv_call *c, struct mgcu_algos *l, const char *call, int line)
{
    int first, tried, from = l->a[l->at].algo;
    int st = mgcu_algo_run(l, c->b->precision == MG_PRECISION_TF32, c->e->ws, conv_try, c, &first,
                           &tried);
    if (st == 0)
        return 0;
    if (tried == 2) {
        /* both failed: the error is the second's, and names the first */
        struct mgcu_err second = {0};
        mgcu_cudnn_failed(&second, (cudnnStatus_t)st, call, __FILE__, line);
        mgcu_fail(&c->b->err, second.code, "%.400s (with algorithm %d, after algorithm %d: %s)",
                  second.msg, l->a[l->at].algo, from, cudnnGetErrorString((cudnnStatus_t)first));
    } else {
        mgcu_cudnn_failed(&c->b->err, (cudnnStatus_t)st, call, __FILE__, line);
    }
    return -1;
}

void mgcu_conv_forward(struct mgcu_backend *b, struct mgcu_conv *e, float *y, const float *x,
                       const float *w, void *scratch)
{
    const float zero = 0.0f;
    struct conv_call c = {b, e, CONV_FWD, x, w, NULL, y, &zero, scratch};
    conv_run(&c, &e->fwd, "cudnnConvolutionForward", __LINE__);
}

void mgcu_conv_backward_filter(struct mgcu_backend *b, struct mgcu_conv *e, float *dw,
                               const float *x, const float *dy, int accumulate, void *scratch)
{
    const float one = 1.0f, zero = 0.0f;
    struct conv_call c = {b,  e,  CONV_BWD_FILTER,           x,      NULL,
                          dy, dw, accumulate ? &one : &zero, scratch};
    conv_run(&c, &e->bwd_filter, "cudnnConvolutionBackwardFilter", __LINE__);
}

void mgcu_conv_backward_data(struct mgcu_backend *b, struct mgcu_conv *e, float *dx, const float *w,
                             const float *dy, void *scratch)
{
    const float zero = 0.0f;
    struct conv_call c = {b, e, CONV_BWD_DATA, NULL, w, dy, dx, &zero, scratch};
    conv_run(&c, &e->bwd_data, "cudnnConvolutionBackwardData", __LINE__);
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

struct mgcu_conv *mgcu_conv_get(struct mgcu_backend *b, const struct mg_conv2d_dims *d)
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
