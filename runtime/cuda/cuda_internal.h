/* What the CUDA plugin's files share (not an interface of libmg): libmg's
 * functions lent at init, the first-error latch every CUDA, cuBLAS, cuDNN and
 * NCCL call goes through, the backend's state, and its convolution cache.
 *
 * The latch keeps the first failure with the call, the file and line, and
 * the library's own message ("cuda_backend.c:212: cudaMemcpyAsync: an illegal
 * memory access was encountered (cudaErrorIllegalAddress)"); the backend's
 * sync() returns it. Nothing here prints or exits. */
#ifndef MG_CUDA_INTERNAL_H
#define MG_CUDA_INTERNAL_H

#include "backend.h"
#include "cuda_algo.h"
#include "gpu_plugin.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

extern const struct mg_gpu_host *mgcu_host;

struct mgcu_err {
    int code; /* 0, or the first failure's negative code */
    char msg[MG_ERRMSG_LEN];
};

/* Record a failure unless one is already kept; each returns nonzero when the
 * status is a failure. call is the call's text: its name is kept. */
int mgcu_cuda_failed(struct mgcu_err *e, cudaError_t st, const char *call, const char *file,
                     int line);
int mgcu_cublas_failed(struct mgcu_err *e, cublasStatus_t st, const char *call, const char *file,
                       int line);
int mgcu_cudnn_failed(struct mgcu_err *e, cudnnStatus_t st, const char *call, const char *file,
                      int line);
__attribute__((format(printf, 3, 4))) void mgcu_fail(struct mgcu_err *e, int code, const char *fmt,
                                                     ...);
/* The code a CUDA error maps to: -ENOMEM, -ENODEV (no such or no free device),
 * -ENXIO (no driver, a stub), -MG_EVERSION (a driver too old), else -EIO. */
int mgcu_cuda_code(cudaError_t st);
/* mg_seterr's twin (the plugin links no libmg): the message into err, returns code. */
__attribute__((format(printf, 4, 5))) int mgcu_seterr(char *err, size_t errlen, int code,
                                                      const char *fmt, ...);

#define CU_FAILED(e, call)     mgcu_cuda_failed((e), (call), #call, __FILE__, __LINE__)
#define CUBLAS_FAILED(e, call) mgcu_cublas_failed((e), (call), #call, __FILE__, __LINE__)
#define CUDNN_FAILED(e, call)  mgcu_cudnn_failed((e), (call), #call, __FILE__, __LINE__)

/* ---- the convolution cache (cuda_conv.c) ------------------------------------------- */

/* One convolution shape: cuDNN's descriptors and the algorithms chosen for
 * it, once: the first deterministic one whose workspace fits, with FMA math
 * (no TF32) unless the backend's precision allows TF32; the next one where
 * that fails when it runs. */
struct mgcu_conv {
    struct mg_conv2d_dims d;
    cudnnTensorDescriptor_t x, y;
    cudnnFilterDescriptor_t w;
    cudnnConvolutionDescriptor_t conv;
    /* cuDNN's candidates for each direction and the one in use (cuda_algo.h) */
    struct mgcu_algos fwd, bwd_data, bwd_filter;
    size_t ws;      /* workspace bytes, the most of the three */
    size_t partial; /* where the bias gradient's per-plane sums go in scratch */
};

#define MGCU_CONV_CACHE 64

/* The scratch each shape was promised by conv2d_scratch, by shape without the
 * batch size: a smaller last batch gets algorithms that fit in it too. */
struct mgcu_conv_budget {
    struct mg_conv2d_dims d; /* n unused */
    size_t bytes;
};

struct mgcu_convs {
    struct mgcu_conv e[MGCU_CONV_CACHE];
    int n, next_evict;
    struct mgcu_conv_budget budget[MGCU_CONV_CACHE];
    int nbudget;
};

/* ---- the backend ---------------------------------------------------------------------- */

#define MGCU_UPLOAD_SLOTS 16
#define MGCU_EVENTS       64

struct mgcu_backend {
    struct mg_backend be;
    char name[MG_ERRMSG_LEN];
    int device;
    enum mg_precision precision;
    cudaStream_t compute, copy;
    cublasHandle_t blas;
    cudnnHandle_t dnn;
    void *blas_ws;
    struct mgcu_err err;          /* the first error since the last sync() */
    char last_msg[MG_ERRMSG_LEN]; /* the error sync() returned last */
    struct mgcu_convs convs;

    /* upload_async: the event of each ticket's copy, by ticket % slots */
    cudaEvent_t up_event[MGCU_UPLOAD_SLOTS];
    uint64_t up_ticket[MGCU_UPLOAD_SLOTS];
    uint64_t last_ticket, done_ticket;

    /* event_record's pool; a communicator's thread may release them */
    pthread_mutex_t event_lock;
    cudaEvent_t events[MGCU_EVENTS];
    int event_used[MGCU_EVENTS];
};

/* Bytes conv2d needs in scratch for d (and records that budget); 0 after a failure. */
size_t mgcu_conv_scratch(struct mgcu_backend *b, const struct mg_conv2d_dims *d);
/* d's cache entry, made on first use within the budget of its shape; NULL
 * after a failure (latched in b->err). */
struct mgcu_conv *mgcu_conv_get(struct mgcu_backend *b, const struct mg_conv2d_dims *d);
/* The three convolutions of e (y = conv(x, w); dw (+)= ...; dx = ...), each with its algorithm,
 * or the next one when that fails as it runs; a failure is latched in b->err. */
void mgcu_conv_forward(struct mgcu_backend *b, struct mgcu_conv *e, float *y, const float *x,
                       const float *w, void *scratch);
void mgcu_conv_backward_filter(struct mgcu_backend *b, struct mgcu_conv *e, float *dw,
                               const float *x, const float *dy, int accumulate, void *scratch);
void mgcu_conv_backward_data(struct mgcu_backend *b, struct mgcu_conv *e, float *dx, const float *w,
                             const float *dy, void *scratch);
void mgcu_convs_release(struct mgcu_convs *c);

/* cuDNN's output shapes (the plugin's conv2d_out_dims / pool2d_out_dims). */
int mgcu_conv2d_out_dims(const struct mg_conv2d_dims *d, int out[4], char *err, size_t errlen);
int mgcu_pool2d_out_dims(const struct mg_pool2d_dims *d, int out[4], char *err, size_t errlen);

/* The plugin's entry points (cuda_backend.c, comm_nccl.c, cuda_plugin.c). */
int mgcu_backend_create(const struct mg_backend_opts *opts, struct mg_backend **out, char *err,
                        size_t errlen);
int mgcu_info(int device_index, struct mg_gpu_info *info, char *err, size_t errlen);
int mgcu_comm_create(struct mg_comm **out, struct mg_store *store, const struct mg_comm_opts *opts,
                     char *err, size_t errlen);
int mgcu_nccl_exchange_id(struct mg_store *store, const struct mg_comm_opts *opts,
                          unsigned char id[MG_NCCL_ID_BYTES], char *err, size_t errlen);

#endif
