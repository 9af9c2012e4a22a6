/* The CUDA compute backend: struct mg_backend_ops on one GPU (backend.h),
 * checked op by op against the CPU backend (tests/unit/test_cuda_backend.c).
 *
 * One compute stream takes every op in order, and a copy stream takes
 * upload_async, so a batch uploads while the previous one computes. Matrix
 * products go to cuBLAS (row-major through the transpose trick: a row-major
 * matrix is its transpose in column-major), convolutions to cuDNN
 * (cuda_conv.c), everything else to our kernels (cuda_kernels.cu). cuBLAS gets
 * a fixed workspace and FP32 math (no TF32 unless precision says so), so a
 * shape gives the same bits every time on a given GPU. Memory is allocated
 * only by alloc/host_alloc, which the models call when they are built, never
 * in the step loop.
 *
 * Every status is checked; the first failure is kept in b->err with its
 * call, file, line and the library's message, and sync() returns it. */
#include "cuda_internal.h"
#include "cuda_kernels.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define BLAS_WORKSPACE ((size_t)32 << 20) /* cuBLAS's recommendation for Hopper */

static struct mgcu_backend *B(struct mg_backend *be)
{
    return (struct mgcu_backend *)be;
}

/* Launches on the compute stream, at the width the launcher picks. */
static struct mgk_cfg cfg_of(struct mgcu_backend *b)
{
    return (struct mgk_cfg){.stream = b->compute};
}

static void launched(struct mgcu_backend *b, int rc, const char *kernel, int line)
{
    if (rc)
        mgcu_cuda_failed(&b->err, (cudaError_t)rc, kernel, __FILE__, line);
}

#define KERNEL(b, name, ...)                                                                       \
    do {                                                                                           \
        struct mgk_cfg cfg_ = cfg_of(b);                                                           \
        launched((b), name(&cfg_, __VA_ARGS__), #name, __LINE__);                                  \
    } while (0)

/* ---- memory ----------------------------------------------------------------------------- */

static void *cu_alloc(struct mg_backend *be, size_t bytes)
{
    struct mgcu_backend *b = B(be);
    void *p = NULL;
    bytes = bytes ? (bytes + 255) & ~(size_t)255 : 256;
    if (CU_FAILED(&b->err, cudaMalloc(&p, bytes)))
        return NULL;
    /* zero-filled before any stream can touch it, the copy stream included */
    if (CU_FAILED(&b->err, cudaMemsetAsync(p, 0, bytes, b->compute)) ||
        CU_FAILED(&b->err, cudaStreamSynchronize(b->compute))) {
        cudaFree(p);
        return NULL;
    }
    return p;
}

static void cu_free(struct mg_backend *be, void *p)
{
    struct mgcu_backend *b = B(be);
    if (!p)
        return;
    /* the streams may still use it */
    CU_FAILED(&b->err, cudaStreamSynchronize(b->copy));
    CU_FAILED(&b->err, cudaStreamSynchronize(b->compute));
    CU_FAILED(&b->err, cudaFree(p));
}

/* From pageable memory: the copy takes the source before the call returns,
 * so the caller may reuse it at once, as on the CPU. */
static void cu_upload(struct mg_backend *be, void *dst, const void *host_src, size_t bytes)
{
    struct mgcu_backend *b = B(be);
    if (bytes)
        CU_FAILED(&b->err,
                  cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, b->compute));
}

/* The host reads what it downloaded as soon as this returns: it waits. */
static void cu_download(struct mg_backend *be, void *host_dst, const void *src, size_t bytes)
{
    struct mgcu_backend *b = B(be);
    if (!bytes)
        return;
    if (!CU_FAILED(&b->err,
                   cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, b->compute)))
        CU_FAILED(&b->err, cudaStreamSynchronize(b->compute));
}

/* memmove's contract: overlapping ranges are copied in pieces no longer than
 * their distance, walking away from the overlap. */
static void cu_copy(struct mg_backend *be, void *dst, const void *src, size_t bytes)
{
    struct mgcu_backend *b = B(be);
    char *d = dst;
    const char *s = src;
    if (d == s || !bytes)
        return;
    size_t gap = d > s ? (size_t)(d - s) : (size_t)(s - d);
    if (gap >= bytes) {
        CU_FAILED(&b->err, cudaMemcpyAsync(d, s, bytes, cudaMemcpyDeviceToDevice, b->compute));
        return;
    }
    if (d < s) {
        for (size_t at = 0; at < bytes; at += gap) {
            size_t n = bytes - at < gap ? bytes - at : gap;
            if (CU_FAILED(&b->err,
                          cudaMemcpyAsync(d + at, s + at, n, cudaMemcpyDeviceToDevice, b->compute)))
                return;
        }
    } else {
        for (size_t end = bytes; end > 0;) {
            size_t n = end < gap ? end : gap;
            end -= n;
            if (CU_FAILED(&b->err, cudaMemcpyAsync(d + end, s + end, n, cudaMemcpyDeviceToDevice,
                                                   b->compute)))
                return;
        }
    }
}

static void cu_zero(struct mg_backend *be, void *p, size_t bytes)
{
    struct mgcu_backend *b = B(be);
    if (bytes)
        CU_FAILED(&b->err, cudaMemsetAsync(p, 0, bytes, b->compute));
}

static int cu_sync(struct mg_backend *be)
{
    struct mgcu_backend *b = B(be);
    CU_FAILED(&b->err, cudaStreamSynchronize(b->copy));
    CU_FAILED(&b->err, cudaStreamSynchronize(b->compute));
    int rc = b->err.code;
    if (rc) {
        /* the first error since the last sync: reported now, its message kept */
        memcpy(b->last_msg, b->err.msg, sizeof(b->last_msg));
        b->err.code = 0;
    }
    return rc;
}

static const char *cu_errmsg(struct mg_backend *be)
{
    struct mgcu_backend *b = B(be);
    return b->err.code ? b->err.msg : b->last_msg;
}

/* ---- layers ------------------------------------------------------------------------------ */

/* Row-major C[m][n] = A . B: in column-major that is C^T = B^T A^T, and a
 * row-major matrix read as column-major is its transpose. So every product
 * below names its operands swapped, with the row lengths as leading
 * dimensions. */
static void cu_linear_forward(struct mg_backend *be, float *y, const float *x, const float *w,
                              const float *bias, int n, int in, int out, int relu)
{
    struct mgcu_backend *b = B(be);
    const float one = 1.0f, zero = 0.0f;
    /* y[n][out] = x[n][in] . w[out][in]^T  <=>  y^T = w . x^T (column-major) */
    if (CUBLAS_FAILED(&b->err, cublasSgemm(b->blas, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &one, w,
                                           in, x, in, &zero, y, out)))
        return;
    KERNEL(b, mgk_bias_rows, y, bias, n, out, relu);
}

static size_t cu_linear_scratch(struct mg_backend *be, int n, int in, int out)
{
    return 0; /* cuBLAS has its own fixed workspace */
}

static void cu_linear_backward(struct mg_backend *be, float *dx, float *dw, float *db,
                               const float *dy, const float *x, const float *w, int n, int in,
                               int out, int accumulate, void *scratch)
{
    struct mgcu_backend *b = B(be);
    const float one = 1.0f, zero = 0.0f;
    if (db)
        KERNEL(b, mgk_colsum, db, dy, n, out, accumulate);
    /* dw[out][in] (+)= dy^T x  <=>  dw^T = x^T . dy (column-major) */
    if (CUBLAS_FAILED(&b->err, cublasSgemm(b->blas, CUBLAS_OP_N, CUBLAS_OP_T, in, out, n, &one, x,
                                           in, dy, out, accumulate ? &one : &zero, dw, in)))
        return;
    /* dx[n][in] = dy w  <=>  dx^T = w^T . dy^T (column-major) */
    if (dx)
        CUBLAS_FAILED(&b->err, cublasSgemm(b->blas, CUBLAS_OP_N, CUBLAS_OP_N, in, n, out, &one, w,
                                           in, dy, out, &zero, dx, in));
}

static size_t cu_conv2d_scratch(struct mg_backend *be, const struct mg_conv2d_dims *d)
{
    return mgcu_conv_scratch(B(be), d);
}

static void cu_conv2d_forward(struct mg_backend *be, const struct mg_conv2d_dims *d, float *y,
                              const float *x, const float *w, const float *bias, int relu,
                              void *scratch)
{
    struct mgcu_backend *b = B(be);
    struct mgcu_conv *e = mgcu_conv_get(b, d);
    if (!e)
        return;
    mgcu_conv_forward(b, e, y, x, w, scratch);
    if (b->err.code)
        return;
    KERNEL(b, mgk_conv_bias, y, bias, d->n, d->oc, d->oh * d->ow, relu);
}

static void cu_conv2d_backward(struct mg_backend *be, const struct mg_conv2d_dims *d, float *dx,
                               float *dw, float *db, float *dy, const float *x, const float *w,
                               const float *y, int relu, int accumulate, int sparse_dy,
                               void *scratch)
{
    struct mgcu_backend *b = B(be);
    struct mgcu_conv *e = mgcu_conv_get(b, d);
    int P = d->oh * d->ow;
    size_t total = (size_t)d->n * d->oc * P;
    if (!e)
        return;
    if (relu)
        KERNEL(b, mgk_relu_mask, dy, dy, y, total);
    if (db) {
        /* each plane's sum, then over samples in order: the CPU's dense order */
        float *part = (float *)((char *)scratch + e->partial);
        KERNEL(b, mgk_row_sums16, part, dy, d->n * d->oc, (size_t)P);
        KERNEL(b, mgk_colsum, db, part, d->n, d->oc, accumulate);
    }
    mgcu_conv_backward_filter(b, e, dw, x, dy, accumulate, scratch);
    if (dx && !b->err.code)
        mgcu_conv_backward_data(b, e, dx, w, dy, scratch);
}

static void cu_maxpool2d_forward(struct mg_backend *be, const struct mg_pool2d_dims *d, float *y,
                                 int32_t *idx, const float *x)
{
    KERNEL(B(be), mgk_maxpool_fwd, y, idx, x, d->n * d->c, d->h, d->w, d->k, d->stride, d->oh,
           d->ow);
}

static void cu_maxpool2d_backward(struct mg_backend *be, const struct mg_pool2d_dims *d, float *dx,
                                  const float *dy, const int32_t *idx)
{
    KERNEL(B(be), mgk_maxpool_bwd, dx, dy, idx, d->n * d->c, d->h, d->w, d->k, d->stride, d->oh,
           d->ow);
}

static void cu_relu_forward(struct mg_backend *be, float *y, const float *x, size_t n)
{
    KERNEL(B(be), mgk_relu, y, x, n);
}

static void cu_relu_backward(struct mg_backend *be, float *dx, const float *dy, const float *y,
                             size_t n)
{
    KERNEL(B(be), mgk_relu_mask, dx, dy, y, n);
}

static void cu_dropout_forward(struct mg_backend *be, float *y, uint8_t *mask, const float *x,
                               size_t n, float p, uint64_t seed, uint64_t offset)
{
    KERNEL(B(be), mgk_dropout_fwd, y, mask, x, n, p, seed, offset);
}

static void cu_dropout_backward(struct mg_backend *be, float *dx, const float *dy,
                                const uint8_t *mask, size_t n, float p)
{
    KERNEL(B(be), mgk_dropout_bwd, dx, dy, mask, n, p);
}

/* Above this many classes a block per row beats a thread per row. */
#define XENT_BLOCK_CLASSES 128

static void cu_xent_forward(struct mg_backend *be, float *loss, int32_t *correct, float *probs,
                            const float *logits, const int32_t *labels, int n, int classes)
{
    if (classes > XENT_BLOCK_CLASSES)
        KERNEL(B(be), mgk_xent_fwd_blocks, loss, correct, probs, logits, labels, n, classes);
    else
        KERNEL(B(be), mgk_xent_fwd_rows, loss, correct, probs, logits, labels, n, classes);
}

static void cu_xent_backward(struct mg_backend *be, float *dlogits, const float *probs,
                             const int32_t *labels, int n, int classes, float scale)
{
    KERNEL(B(be), mgk_xent_bwd, dlogits, probs, labels, n, classes, scale);
}

_Static_assert(MG_ACC_LEN == MGK_ACC_LEN && MG_ACC_STEP == 0 && MG_ACC_TOTAL == 1 &&
                   MG_ACC_CORRECT == 2 && MG_ACC_BAD_STEP == 3 && MG_ACC_BAD_LOSS == 4,
               "mgk_loss_acc's slots");

static void cu_loss_accumulate(struct mg_backend *be, double *acc, const float *loss,
                               const int32_t *correct, int n, int close, int64_t step)
{
    KERNEL(B(be), mgk_loss_acc, acc, loss, correct, n, close, step);
}

static void cu_sgd_step(struct mg_backend *be, float *p, const float *g, float *buf, size_t n,
                        double lr, double momentum, double weight_decay, int nesterov, int first)
{
    KERNEL(B(be), mgk_sgd, p, g, buf, n, lr, momentum, weight_decay, nesterov, first);
}

static void cu_adamw_step(struct mg_backend *be, float *p, const float *g, float *m, float *v,
                          size_t n, double lr, double beta1, double beta2, double eps,
                          double weight_decay, uint64_t step)
{
    KERNEL(B(be), mgk_adamw, p, g, m, v, n, lr, beta1, beta2, eps, weight_decay, step);
}

static void cu_scale(struct mg_backend *be, float *x, float a, size_t n)
{
    KERNEL(B(be), mgk_scale, x, a, n);
}

/* ---- overlap -------------------------------------------------------------------------------- */

static void *cu_host_alloc(struct mg_backend *be, size_t bytes)
{
    struct mgcu_backend *b = B(be);
    void *p = NULL;
    if (CU_FAILED(&b->err, cudaHostAlloc(&p, bytes ? bytes : 64, cudaHostAllocDefault)))
        return NULL;
    return p;
}

static void cu_host_free(struct mg_backend *be, void *p)
{
    struct mgcu_backend *b = B(be);
    if (!p)
        return;
    CU_FAILED(&b->err, cudaStreamSynchronize(b->copy));
    CU_FAILED(&b->err, cudaFreeHost(p));
}

static uint64_t cu_upload_async(struct mg_backend *be, void *dst, const void *host_src,
                                size_t bytes)
{
    struct mgcu_backend *b = B(be);
    uint64_t t = b->last_ticket + 1;
    int slot = (int)(t % MGCU_UPLOAD_SLOTS);
    if (bytes &&
        CU_FAILED(&b->err, cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, b->copy)))
        return 0;
    /* a slot's event is re-recorded by a later ticket: waiting on that one
     * waits for more, never for less (the copy stream runs in order) */
    if (CU_FAILED(&b->err, cudaEventRecord(b->up_event[slot], b->copy)))
        return 0;
    b->up_ticket[slot] = t;
    b->last_ticket = t;
    return t;
}

static void cu_upload_wait(struct mg_backend *be, uint64_t ticket)
{
    struct mgcu_backend *b = B(be);
    int slot = (int)(ticket % MGCU_UPLOAD_SLOTS);
    if (!ticket || ticket <= b->done_ticket || ticket > b->last_ticket)
        return;
    CU_FAILED(&b->err, cudaStreamWaitEvent(b->compute, b->up_event[slot], 0));
}

static int cu_upload_done(struct mg_backend *be, uint64_t ticket, int wait)
{
    struct mgcu_backend *b = B(be);
    int slot = (int)(ticket % MGCU_UPLOAD_SLOTS);
    if (!ticket || ticket <= b->done_ticket || ticket > b->last_ticket)
        return 1;
    cudaError_t st =
        wait ? cudaEventSynchronize(b->up_event[slot]) : cudaEventQuery(b->up_event[slot]);
    if (st == cudaErrorNotReady)
        return 0;
    if (!CU_FAILED(&b->err, st) && b->up_ticket[slot] > b->done_ticket)
        b->done_ticket = b->up_ticket[slot];
    return 1;
}

static void *cu_event_record(struct mg_backend *be)
{
    struct mgcu_backend *b = B(be);
    void *ev = NULL;
    pthread_mutex_lock(&b->event_lock);
    for (int i = 0; i < MGCU_EVENTS; i++)
        if (!b->event_used[i]) {
            if (!CU_FAILED(&b->err, cudaEventRecord(b->events[i], b->compute))) {
                b->event_used[i] = 1;
                ev = b->events[i];
            }
            break;
        }
    if (!ev && !b->err.code)
        mgcu_fail(&b->err, -ENOSPC, "event_record: all %d events are in use (none released)",
                  MGCU_EVENTS);
    pthread_mutex_unlock(&b->event_lock);
    return ev;
}

/* compute -> copy: the copy stream waits for the compute work before event */
static void cu_upload_after(struct mg_backend *be, void *event)
{
    struct mgcu_backend *b = B(be);
    CU_FAILED(&b->err, cudaStreamWaitEvent(b->copy, (cudaEvent_t)event, 0));
}

/* What the latch holds: launches and API calls fail at once; a fault inside a
 * kernel shows at a later call or the next sync. */
static int cu_poll(struct mg_backend *be)
{
    return B(be)->err.code;
}

static void cu_event_release(struct mg_backend *be, void *event)
{
    struct mgcu_backend *b = B(be);
    pthread_mutex_lock(&b->event_lock);
    for (int i = 0; i < MGCU_EVENTS; i++)
        if (b->events[i] == (cudaEvent_t)event)
            b->event_used[i] = 0;
    pthread_mutex_unlock(&b->event_lock);
}

/* ---- life ------------------------------------------------------------------------------------ */

static void destroy(struct mgcu_backend *b)
{
    if (b->compute)
        cudaStreamSynchronize(b->compute);
    if (b->copy)
        cudaStreamSynchronize(b->copy);
    mgcu_convs_release(&b->convs);
    for (int i = 0; i < MGCU_UPLOAD_SLOTS; i++)
        if (b->up_event[i])
            cudaEventDestroy(b->up_event[i]);
    for (int i = 0; i < MGCU_EVENTS; i++)
        if (b->events[i])
            cudaEventDestroy(b->events[i]);
    if (b->dnn)
        cudnnDestroy(b->dnn);
    if (b->blas)
        cublasDestroy(b->blas);
    if (b->blas_ws)
        cudaFree(b->blas_ws);
    if (b->copy)
        cudaStreamDestroy(b->copy);
    if (b->compute)
        cudaStreamDestroy(b->compute);
    pthread_mutex_destroy(&b->event_lock);
    free(b);
}

static void cu_release(struct mg_backend *be)
{
    destroy(B(be));
}

static const struct mg_backend_ops cuda_ops = {
    .release = cu_release,
    .alloc = cu_alloc,
    .free = cu_free,
    .upload = cu_upload,
    .download = cu_download,
    .copy = cu_copy,
    .zero = cu_zero,
    .sync = cu_sync,
    .linear_forward = cu_linear_forward,
    .linear_scratch = cu_linear_scratch,
    .linear_backward = cu_linear_backward,
    .conv2d_scratch = cu_conv2d_scratch,
    .conv2d_forward = cu_conv2d_forward,
    .conv2d_backward = cu_conv2d_backward,
    .maxpool2d_forward = cu_maxpool2d_forward,
    .maxpool2d_backward = cu_maxpool2d_backward,
    .relu_forward = cu_relu_forward,
    .relu_backward = cu_relu_backward,
    .dropout_forward = cu_dropout_forward,
    .dropout_backward = cu_dropout_backward,
    .xent_forward = cu_xent_forward,
    .xent_backward = cu_xent_backward,
    .loss_accumulate = cu_loss_accumulate,
    .sgd_step = cu_sgd_step,
    .adamw_step = cu_adamw_step,
    .scale = cu_scale,
    .host_alloc = cu_host_alloc,
    .host_free = cu_host_free,
    .upload_async = cu_upload_async,
    .upload_wait = cu_upload_wait,
    .upload_done = cu_upload_done,
    .event_record = cu_event_record,
    .event_release = cu_event_release,
    .upload_after = cu_upload_after,
    .poll = cu_poll,
    .errmsg = cu_errmsg,
};

/* Each step stops at the first failure: a cuDNN or cuBLAS call on a handle
 * that failed to start would crash (cudnnGet*_v7 does, with a NULL handle). */
static int start(struct mgcu_backend *b, const struct mg_backend_opts *opts)
{
    struct mgcu_err *e = &b->err;
    int count = 0;
    if (CU_FAILED(e, cudaGetDeviceCount(&count)))
        return -1;
    if (b->device < 0 || b->device >= count) {
        mgcu_fail(e, -ENODEV, "no CUDA device %d: the CUDA runtime shows %d", b->device, count);
        return -1;
    }
    if (CU_FAILED(e, cudaSetDevice(b->device)) ||
        CU_FAILED(e, cudaStreamCreateWithFlags(&b->compute, cudaStreamNonBlocking)) ||
        CU_FAILED(e, cudaStreamCreateWithFlags(&b->copy, cudaStreamNonBlocking)))
        return -1;
    for (int i = 0; i < MGCU_UPLOAD_SLOTS; i++)
        if (CU_FAILED(e, cudaEventCreateWithFlags(&b->up_event[i], cudaEventDisableTiming)))
            return -1;
    for (int i = 0; i < MGCU_EVENTS; i++)
        if (CU_FAILED(e, cudaEventCreateWithFlags(&b->events[i], cudaEventDisableTiming)))
            return -1;
    if (CU_FAILED(e, cudaMalloc(&b->blas_ws, BLAS_WORKSPACE)) ||
        CUBLAS_FAILED(e, cublasCreate(&b->blas)) ||
        CUBLAS_FAILED(e, cublasSetStream(b->blas, b->compute)) ||
        CUBLAS_FAILED(e, cublasSetWorkspace(b->blas, b->blas_ws, BLAS_WORKSPACE)) ||
        CUBLAS_FAILED(e, cublasSetMathMode(b->blas, opts->precision == MG_PRECISION_TF32
                                                        ? CUBLAS_TF32_TENSOR_OP_MATH
                                                        : CUBLAS_DEFAULT_MATH)))
        return -1;
    if (CUDNN_FAILED(e, cudnnCreate(&b->dnn)) ||
        CUDNN_FAILED(e, cudnnSetStream(b->dnn, b->compute)))
        return -1;
    /* mg's kernels, loaded now rather than at their first launch, which may be in the
     * middle of an overlapped step (cuda_kernels.h) */
    const char *kernel = "?";
    int n = mgk_preload(&kernel);
    if (n < 0) {
        cudaError_t st = (cudaError_t)-n;
        mgcu_fail(e, mgcu_cuda_code(st), "loading the kernel %s: %s (%s)", kernel,
                  cudaGetErrorString(st), cudaGetErrorName(st));
        return -1;
    }
    return 0;
}

int mgcu_backend_create(const struct mg_backend_opts *opts, struct mg_backend **out, char *err,
                        size_t errlen)
{
    struct mgcu_backend *b = calloc(1, sizeof(*b));
    struct mg_gpu_info info;
    char text[MG_ERRMSG_LEN - 16];
    *out = NULL;
    if (!b)
        return mgcu_seterr(err, errlen, -ENOMEM, "out of memory");
    pthread_mutex_init(&b->event_lock, NULL);
    b->device = opts->device_index;
    b->precision = opts->precision;
    if (start(b, opts) < 0) {
        int rc = mgcu_seterr(err, errlen, b->err.code, "%s", b->err.msg);
        destroy(b);
        return rc;
    }
    if (mgcu_info(b->device, &info, NULL, 0) == 0) {
        mg_gpu_info_text(&info, text, sizeof(text));
        snprintf(b->name, sizeof(b->name), "cuda:%d %s%s", b->device, text,
                 b->precision == MG_PRECISION_TF32 ? "; TF32 allowed" : "");
    } else {
        snprintf(b->name, sizeof(b->name), "cuda:%d", b->device);
    }
    b->be = (struct mg_backend){
        .ops = &cuda_ops,
        .name = b->name,
        .device = MG_DEVICE_CUDA,
        .threads = 1,
        .impl = b,
        .stream = b->compute,
    };
    *out = &b->be;
    return 0;
}
