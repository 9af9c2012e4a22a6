/* The CUDA backend's own kernels (cuda_kernels.cu), as C launchers: every
 * layer op that is not a cuBLAS or cuDNN call, the optimizers, and the
 * communicator's divide. The header names no CUDA type, so plain C includes it:
 * the backend (gcc with the CUDA headers) and the host test, which builds the
 * same .cu with g++ through simt.h and compares each launcher with the CPU
 * kernel of the same name (cpu_kernels.h).
 *
 * Parity with the CPU kernels: every launcher computes the same expression in
 * the same order, and the file is built with -fmad=false (no fused
 * multiply-add), so a GPU gives the CPU's bits, except where noted: the
 * softmax kernels call the GPU's expf and logf, and mgk_xent_fwd_blocks sums
 * in tree order (a stated tolerance in the tests).
 *
 * Pointers are device memory. Each launcher returns 0 or the cudaError_t of
 * its launch (cudaGetLastError); an empty size launches nothing. */
#ifndef MG_CUDA_KERNELS_H
#define MG_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Where a launch runs and how wide it is. Results do not depend on blocks or
 * threads (grid-stride loops); the tests force grids of 1, 3 and many. */
struct mgk_cfg {
    void *stream; /* cudaStream_t; NULL = the legacy default stream */
    int blocks;   /* 0 = enough for the size (capped at MGK_MAX_BLOCKS) */
    int threads;  /* per block; 0 = 256. The block kernels round it up to a whole warp */
};

#define MGK_MAX_BLOCKS 4096

/* y[r][c] = relu?(y[r][c] + b[c]) (b may be NULL: no addition): mg_k_bias_rows */
int mgk_bias_rows(const struct mgk_cfg *cfg, float *y, const float *b, int rows, int cols,
                  int relu);
/* db[c] (+)= sum over r of dy[r][c], rows in order: mg_k_colsum */
int mgk_colsum(const struct mgk_cfg *cfg, float *db, const float *dy, int rows, int cols,
               int accumulate);
/* y[s][o][p] = relu?(y[s][o][p] + b[o]) in place, adding 0 when b is NULL: the
 * epilogue of a cuDNN convolution (mg_k_conv_out's arithmetic) */
int mgk_conv_bias(const struct mgk_cfg *cfg, float *y, const float *b, int n, int oc, int P,
                  int relu);
/* sums[i] = mg_k_sum(x + i * len, len) (its 16-lane order), for i < count */
int mgk_row_sums16(const struct mgk_cfg *cfg, float *sums, const float *x, int count, size_t len);

int mgk_relu(const struct mgk_cfg *cfg, float *y, const float *x, size_t n);
/* dx = y > 0 ? dy : 0; dx may equal dy: mg_k_relu_mask */
int mgk_relu_mask(const struct mgk_cfg *cfg, float *dx, const float *dy, const float *y, size_t n);
int mgk_scale(const struct mgk_cfg *cfg, float *x, float a, size_t n);
/* x[i] = x[i] / d: the average after a sum, as the CPU collectives divide */
int mgk_div(const struct mgk_cfg *cfg, float *x, float d, size_t n);

/* mg_k_dropout_fwd / _bwd: the same counter stream (rng.h), so the same masks */
int mgk_dropout_fwd(const struct mgk_cfg *cfg, float *y, uint8_t *mask, const float *x, size_t n,
                    float p, uint64_t seed, uint64_t offset);
int mgk_dropout_bwd(const struct mgk_cfg *cfg, float *dx, const float *dy, const uint8_t *mask,
                    size_t n, float p);
/* The counter generator itself (mg_rng_counter_u32), for the tests. */
uint32_t mgk_counter_u32(uint64_t seed, uint64_t i);

/* mg_k_maxpool_fwd */
int mgk_maxpool_fwd(const struct mgk_cfg *cfg, float *y, int32_t *idx, const float *x, int planes,
                    int h, int w, int k, int stride, int oh, int ow);
/* mg_k_maxpool_bwd for indices from mgk_maxpool_fwd (each inside its window);
 * dx is overwritten. Overlapping windows (stride < k) add in output order. */
int mgk_maxpool_bwd(const struct mgk_cfg *cfg, float *dx, const float *dy, const int32_t *idx,
                    int planes, int h, int w, int k, int stride, int oh, int ow);

/* mg_k_xent_fwd with one thread per row (the CPU's order; the GPU's expf) */
int mgk_xent_fwd_rows(const struct mgk_cfg *cfg, float *loss, int32_t *correct, float *probs,
                      const float *logits, const int32_t *labels, int n, int classes);
/* the same with one block per row: max and sum as tree reductions (shared
 * memory and warp shuffles), for many classes; argmax still the first maximum */
int mgk_xent_fwd_blocks(const struct mgk_cfg *cfg, float *loss, int32_t *correct, float *probs,
                        const float *logits, const int32_t *labels, int n, int classes);
/* mg_k_xent_bwd */
int mgk_xent_bwd(const struct mgk_cfg *cfg, float *dlogits, const float *probs,
                 const int32_t *labels, int n, int classes, float scale);

/* mg_k_loss_acc: one thread adds in the CPU's order (a few hundred adds per
 * micro-batch), so the sums are the host's bits; acc is MGK_ACC_LEN doubles
 * (backend.h's MG_ACC_* order). */
#define MGK_ACC_LEN 5
int mgk_loss_acc(const struct mgk_cfg *cfg, double *acc, const float *loss, const int32_t *correct,
                 int n, int close, int64_t step);

/* mg_k_sgd and mg_k_adamw, their scalars rounded on the host as the CPU does */
int mgk_sgd(const struct mgk_cfg *cfg, float *p, const float *g, float *buf, size_t n, double lr,
            double momentum, double weight_decay, int nesterov, int first);
int mgk_adamw(const struct mgk_cfg *cfg, float *p, const float *g, float *m, float *v, size_t n,
              double lr, double beta1, double beta2, double eps, double weight_decay,
              uint64_t step);

/* Loads every kernel above now, not at its first launch: returns how many, or minus the
 * cudaError_t of the first that failed (its name in *failed). */
int mgk_preload(const char **failed);

#ifdef __cplusplus
}
#endif

#endif
