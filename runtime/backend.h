/* The compute backend: a struct of function pointers chosen once at startup.
 *
 * Every pointer an op receives is device memory obtained from the same
 * backend's alloc() (on the CPU backend that is ordinary host memory). Ops are
 * void: a device backend may queue them, and sync() reports the first error.
 * Shapes are row-major and follow PyTorch: activations are NCHW, a linear
 * weight is [out][in], a conv weight is [oc][c][kh][kw].
 *
 * Backward ops write parameter gradients (dw, db) when accumulate == 0 and add
 * to them when accumulate != 0 (later micro-batches of gradient accumulation),
 * so no zeroing pass is needed; they OVERWRITE input gradients (dx), and
 * dx == NULL skips that part (the first layer never needs it).
 *
 * The CPU backend (cpu_backend.c) is the readable reference; the CUDA backend
 * (runtime/cuda/, loaded as a plugin: gpu_plugin.h) implements the same ops
 * and is checked against it (docs/gpu.md says where the bits must match). */
#ifndef MG_BACKEND_H
#define MG_BACKEND_H

#include "mg_config.h"
#include "mg_err.h"

#include <stddef.h>
#include <stdint.h>

enum mg_device {
    MG_DEVICE_CPU = 0,
    MG_DEVICE_CUDA = 1,
};

/* How float32 matrix products may round (CUDA; the CPU is always fp32). */
enum mg_precision {
    MG_PRECISION_FP32 = 0, /* IEEE fp32 multiply-adds: no TF32 tensor cores (the default) */
    MG_PRECISION_TF32 = 1, /* cuBLAS and cuDNN may use TF32 tensor cores (train --tf32 1) */
};

/* The loss accumulator's doubles (loss_accumulate). */
enum mg_loss_acc_slot {
    MG_ACC_STEP,     /* the open step's micro-batches so far */
    MG_ACC_TOTAL,    /* the closed steps' sums, added in step order */
    MG_ACC_CORRECT,  /* correct predictions, over every micro-batch */
    MG_ACC_BAD_STEP, /* the first closed step whose sum was NaN or infinite; 0: none */
    MG_ACC_BAD_LOSS, /* that sum */
    MG_ACC_LEN,
};

struct mg_backend_opts {
    int threads;      /* BLAS threads; 0 = OMP_NUM_THREADS from the environment, else 1 */
    int device_index; /* CUDA: which GPU; ignored by the CPU backend */
    enum mg_precision precision; /* CUDA; ignored by the CPU backend */
};

struct mg_conv2d_dims {
    int n, c, h, w;  /* input */
    int oc, kh, kw;  /* weight */
    int stride, pad; /* same in both directions */
    int oh, ow;      /* output, filled by mg_conv2d_dims_finish() */
};

struct mg_pool2d_dims {
    int n, c, h, w; /* input */
    int k, stride;  /* square window */
    int oh, ow;     /* output (floor mode, as PyTorch's default) */
};

/* Computes oh/ow; returns -EINVAL when the output would be empty. */
int mg_conv2d_dims_finish(struct mg_conv2d_dims *d);
int mg_pool2d_dims_finish(struct mg_pool2d_dims *d);

struct mg_backend;

/* What a backend implements: one const table per backend (cpu_backend.c,
 * the CUDA plugin), as struct mg_comm_ops is for communicators. */
struct mg_backend_ops {
    void (*release)(struct mg_backend *be);

    /* ---- memory ---- */
    /* zero-filled, 64-byte aligned; NULL when out of memory */
    void *(*alloc)(struct mg_backend *be, size_t bytes);
    void (*free)(struct mg_backend *be, void *p);
    void (*upload)(struct mg_backend *be, void *dst, const void *host_src, size_t bytes);
    void (*download)(struct mg_backend *be, void *host_dst, const void *src, size_t bytes);
    void (*copy)(struct mg_backend *be, void *dst, const void *src, size_t bytes);
    void (*zero)(struct mg_backend *be, void *p, size_t bytes);
    /* waits for all queued work; returns 0 or the first error since the last sync */
    int (*sync)(struct mg_backend *be);

    /* ---- layers ---- */
    /* y[n][out] = x[n][in] . w[out][in]^T + b, then max(0, .) when relu */
    void (*linear_forward)(struct mg_backend *be, float *y, const float *x, const float *w,
                           const float *b, int n, int in, int out, int relu);
    /* scratch: linear_scratch() bytes. A backend may skip the zeros of dy (a ReLU before
     * it leaves many): same result up to rounding order, chosen from dy alone, so the
     * same data always gives the same bits. */
    size_t (*linear_scratch)(struct mg_backend *be, int n, int in, int out);
    void (*linear_backward)(struct mg_backend *be, float *dx, float *dw, float *db, const float *dy,
                            const float *x, const float *w, int n, int in, int out, int accumulate,
                            void *scratch);
    /* bytes of scratch memory conv2d needs for these dimensions (forward and backward) */
    size_t (*conv2d_scratch)(struct mg_backend *be, const struct mg_conv2d_dims *d);
    void (*conv2d_forward)(struct mg_backend *be, const struct mg_conv2d_dims *d, float *y,
                           const float *x, const float *w, const float *b, int relu, void *scratch);
    /* when relu: y is the forward output and dy is masked by (y > 0) first (dy is modified).
     * sparse_dy is a hint that most of dy is zero (a max-pool follows): a backend may then
     * skip the zeros instead of running dense products. The result is the same up to
     * rounding order, and the same bits every time for the same hint. */
    void (*conv2d_backward)(struct mg_backend *be, const struct mg_conv2d_dims *d, float *dx,
                            float *dw, float *db, float *dy, const float *x, const float *w,
                            const float *y, int relu, int accumulate, int sparse_dy, void *scratch);
    /* idx receives, per output element, the offset of its maximum inside the input plane */
    void (*maxpool2d_forward)(struct mg_backend *be, const struct mg_pool2d_dims *d, float *y,
                              int32_t *idx, const float *x);
    void (*maxpool2d_backward)(struct mg_backend *be, const struct mg_pool2d_dims *d, float *dx,
                               const float *dy, const int32_t *idx);
    void (*relu_forward)(struct mg_backend *be, float *y, const float *x, size_t n);
    /* dx = dy * (y > 0); dx may equal dy */
    void (*relu_backward)(struct mg_backend *be, float *dx, const float *dy, const float *y,
                          size_t n);
    /* keep with probability 1-p, scale kept values by 1/(1-p); element i uses
     * number offset+i of the counter stream `seed` (rng.h) */
    void (*dropout_forward)(struct mg_backend *be, float *y, uint8_t *mask, const float *x,
                            size_t n, float p, uint64_t seed, uint64_t offset);
    void (*dropout_backward)(struct mg_backend *be, float *dx, const float *dy, const uint8_t *mask,
                             size_t n, float p);

    /* ---- loss ---- */
    /* per sample: loss[i] = logsumexp(logits[i]) - logits[i][label[i]],
     * correct[i] = argmax(logits[i]) == label[i] (first maximum wins),
     * probs = softmax(logits) kept for the backward */
    void (*xent_forward)(struct mg_backend *be, float *loss, int32_t *correct, float *probs,
                         const float *logits, const int32_t *labels, int n, int classes);
    /* dlogits = (probs - onehot(label)) * scale; scale = 1/(samples in the step) */
    void (*xent_backward)(struct mg_backend *be, float *dlogits, const float *probs,
                          const int32_t *labels, int n, int classes, float scale);
    /* The loss figures, kept on the device until a report reads them (acc:
     * MG_ACC_LEN doubles of device memory, zeroed to start): acc[MG_ACC_STEP]
     * += the sum in double of loss[0..n) in sample order (the order the host
     * summed them in, so the same bits), acc[MG_ACC_CORRECT] += the count of
     * correct[0..n). close != 0 then ends step `step`: when its sum is NaN or
     * infinite and no step's was before, acc[MG_ACC_BAD_STEP] = step and
     * acc[MG_ACC_BAD_LOSS] = that sum; acc[MG_ACC_TOTAL] += acc[MG_ACC_STEP];
     * acc[MG_ACC_STEP] = 0. Counts are exact in a double up to 2^53. */
    void (*loss_accumulate)(struct mg_backend *be, double *acc, const float *loss,
                            const int32_t *correct, int n, int close, int64_t step);

    /* ---- optimizers, over flat buffers (exact PyTorch update order, see optim.h) ---- */
    /* first != 0 on the first step: the momentum buffer starts as the gradient */
    /* Scalars are doubles so they are rounded exactly where PyTorch rounds them. */
    void (*sgd_step)(struct mg_backend *be, float *p, const float *g, float *buf, size_t n,
                     double lr, double momentum, double weight_decay, int nesterov, int first);
    /* step counts from 1 (AdamW's t) */
    void (*adamw_step)(struct mg_backend *be, float *p, const float *g, float *m, float *v,
                       size_t n, double lr, double beta1, double beta2, double eps,
                       double weight_decay, uint64_t step);
    /* x *= a (gradient averaging) */
    void (*scale)(struct mg_backend *be, float *x, float a, size_t n);

    /* ---- overlap: optional, NULL where every op completes before it returns (the
     * CPU). Call them through the mg_backend_* wrappers below, which stand in for
     * a NULL op. A device backend has a compute stream (where every op above is
     * queued, in order) and a copy stream, so that the next batch uploads while
     * this one computes. ---- */
    /* page-locked host memory, the source upload_async needs; NULL when out of memory */
    void *(*host_alloc)(struct mg_backend *be, size_t bytes);
    void (*host_free)(struct mg_backend *be, void *p);
    /* Queues a copy of bytes from host_src (host_alloc memory) to dst on the copy
     * stream and returns its ticket (> 0; 0 when the backend has failed). The
     * compute stream does not wait for it until upload_wait; host_src must stay
     * untouched until upload_done says the copy finished. */
    uint64_t (*upload_async)(struct mg_backend *be, void *dst, const void *host_src, size_t bytes);
    /* Ops queued from now on run after the uploads up to ticket: the device
     * waits, the host does not. */
    void (*upload_wait)(struct mg_backend *be, uint64_t ticket);
    /* 1 when the uploads up to ticket finished (their host memory may be
     * reused), 0 when not yet; wait != 0 blocks until they have, or the
     * backend failed (then 1, and sync() reports the error). */
    int (*upload_done)(struct mg_backend *be, uint64_t ticket, int wait);
    /* A marker of the work queued on the compute stream so far (a cudaEvent_t
     * on CUDA), which a communicator can order a collective after without the
     * host waiting (mg_comm_wait_event: DDP sends a bucket as soon as backward
     * has queued its layers). NULL on failure. Released once the collective
     * that waits on it has been queued. */
    void *(*event_record)(struct mg_backend *be);
    void (*event_release)(struct mg_backend *be, void *event);
    /* Copies queued by upload_async from now on start once the work recorded
     * by event is done: the device waits, the host does not. The trainer
     * reuses a batch slot's device buffers this way only after the compute
     * that read them (compute -> copy ordering). */
    void (*upload_after)(struct mg_backend *be, void *event);
    /* The first error since the last sync, without waiting for queued work:
     * 0 when none so far (a fault of work still running shows at the next
     * sync). The step loop asks this instead of synchronizing every step. */
    int (*poll)(struct mg_backend *be);
    /* What the error sync() returned last (or the first one since, not yet
     * returned) was, with the call, file and line, and the library's own
     * words: "cuda_backend.c:169: cublasSgemm: an unsupported value or
     * parameter was passed to the function (CUBLAS_STATUS_INVALID_VALUE)";
     * "" when none. */
    const char *(*errmsg)(struct mg_backend *be);
};

/* One backend instance: its ops and the fields common to every device. */
struct mg_backend {
    const struct mg_backend_ops *ops;
    const char *name; /* for humans: "cpu (OpenBLAS Haswell, 1 thread)", or the GPU,
                         its memory and the driver and library versions (the banner) */
    enum mg_device device;
    int threads;
    void *impl;
    void *stream; /* CUDA: the compute stream (a cudaStream_t), for the communicator
                     (mg_comm_opts.stream); NULL on the CPU */
};

/* Creates the backend for a device. Returns -MG_EUNSUPPORTED for a device this
 * build has no backend for, -ENOMEM, or the backend's own init error. */
int mg_backend_create(enum mg_device dev, const struct mg_backend_opts *opts,
                      struct mg_backend **out);
/* The same, with the reason in err when it fails: one line that says which of
 * these it was (docs/gpu.md lists them): this build has no CUDA plugin
 * (-MG_EUNSUPPORTED), the plugin or a library it needs is missing (-ENOENT),
 * the file is not a plugin of this build (-MG_EFORMAT, -MG_EVERSION), no
 * NVIDIA driver (-ENXIO), a driver too old for this build (-MG_EVERSION), no
 * such CUDA device (-ENODEV), or a CUDA, cuBLAS or cuDNN call that failed. */
int mg_backend_open(enum mg_device dev, const struct mg_backend_opts *opts, struct mg_backend **out,
                    char *err, size_t errlen);
void mg_backend_release(struct mg_backend *be);

/* The optional ops above, or what stands in for them: host_alloc is ordinary
 * aligned memory, upload_async an upload() (ticket 1, done at once),
 * event_record NULL (a NULL event orders nothing: there is nothing to wait
 * for), upload_after nothing (uploads are done when they return), poll 0,
 * errmsg "". */
void *mg_backend_host_alloc(struct mg_backend *be, size_t bytes);
void mg_backend_host_free(struct mg_backend *be, void *p);
uint64_t mg_backend_upload_async(struct mg_backend *be, void *dst, const void *host_src,
                                 size_t bytes);
void mg_backend_upload_wait(struct mg_backend *be, uint64_t ticket);
int mg_backend_upload_done(struct mg_backend *be, uint64_t ticket, int wait);
void *mg_backend_event_record(struct mg_backend *be);
void mg_backend_event_release(struct mg_backend *be, void *event);
void mg_backend_upload_after(struct mg_backend *be, void *event);
int mg_backend_poll(struct mg_backend *be);
/* The errmsg op, or "" for a backend without one (its sync() never fails). */
const char *mg_backend_errmsg(struct mg_backend *be);

/* Parses "cpu" / "cuda"; -EINVAL otherwise. */
int mg_device_parse(const char *s, enum mg_device *out);
/* Whether this build contains a backend for dev. */
int mg_device_available(enum mg_device dev);

/* ---- GPUs --------------------------------------------------------------------------- */

/* A GPU and the software it runs with, for the banner. 0 or "" where unknown. */
struct mg_gpu_info {
    char name[96];          /* "NVIDIA H100 80GB HBM3" */
    size_t memory;          /* bytes */
    int cc_major, cc_minor; /* compute capability: 9, 0 */
    int devices;            /* how many the driver shows this process */
    int driver_cuda;        /* the newest CUDA the driver supports: 13000 */
    char driver[32];        /* the driver's version: "580.65.06" */
    int runtime;            /* the CUDA runtime's version (plugin only): 13000 */
    int cublas;             /* 130100 */
    int cudnn;              /* 91900 */
    int nccl;               /* 22809 */
};

/* Whether CUDA device device_index is usable, asking the driver only (it loads
 * libcuda.so.1, never the CUDA plugin or its libraries, so a CPU-only machine
 * pays a failed dlopen): 0 with info filled in, or -ENXIO (no NVIDIA driver),
 * -MG_EVERSION (a driver older than this build's CUDA), -ENODEV (no device,
 * or no device device_index), with one line in why. The driver is asked once
 * per process. */
int mg_gpu_probe(int device_index, struct mg_gpu_info *info, char *why, size_t len);

/* What `--device auto` runs on: MG_DEVICE_CUDA when device device_index is
 * usable and the plugin loads, else MG_DEVICE_CPU with the reason in why. */
enum mg_device mg_device_auto(int device_index, char *why, size_t len);

/* "NVIDIA H100 80GB HBM3 (79.1 GiB, sm_90); driver 580.65.06 (CUDA 13.0), runtime
 * 13.0, cuBLAS 13.1.0, cuDNN 9.19.0, NCCL 2.28.9", leaving out what info lacks. */
void mg_gpu_info_format(const struct mg_gpu_info *info, char *buf, size_t len);

/* err (errlen bytes) says why it failed: no BLAS, or a bad MG_BLAS_CORETYPE. */
int mg_cpu_backend_create(const struct mg_backend_opts *opts, struct mg_backend **out, char *err,
                          size_t errlen);
/* Through the plugin (gpu_plugin.c); -MG_EUNSUPPORTED in a build without one. */
int mg_cuda_backend_create(const struct mg_backend_opts *opts, struct mg_backend **out, char *err,
                           size_t errlen);

#endif
