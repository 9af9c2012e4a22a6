/* The CPU backend's own kernels: everything except the dense matrix products,
 * which go to BLAS. Plain loops (and GCC vector types) the compiler vectorizes;
 * the hot ones are cloned for AVX2 and picked at load time (target_clones), so
 * the default build runs on any x86-64. No AVX-512 clone: the rows here are 4
 * to 32 floats long, and 16-wide code measured slower on them; the optimizers
 * stream buffers larger than L2 and measured 9% slower with one (the mlp's
 * SGD step, 203,530 parameters). The exception is gather_axpy, the sparse
 * backward's product, whose rows are 784 to 800 floats: its AVX-512 path
 * takes 30% less time there. Reductions use a fixed order and the file is
 * built with -ffp-contract=off, so every clone and path gives the same bits. */
#ifndef MG_CPU_KERNELS_H
#define MG_CPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__OPTIMIZE__)
#define MG_CLONES           __attribute__((target_clones("avx2", "default")))
#define MG_HAVE_AVX512_PATH 1
#else
#define MG_CLONES
#define MG_HAVE_AVX512_PATH 0
#endif

/* y[r][c] += b[c] (b may be NULL), then relu */
void mg_k_bias_rows(float *y, const float *b, int rows, int cols, int relu);
/* db[c] (+)= sum over r of dy[r][c], rows in order */
void mg_k_colsum(float *db, const float *dy, int rows, int cols, int accumulate);
/* number of nonzero elements of x[0..n) */
size_t mg_k_count_nonzero(const float *x, size_t n);
/* returns sum of x[0..n) in a fixed 16-lane order */
float mg_k_sum(const float *x, size_t n);

void mg_k_relu(float *y, const float *x, size_t n);
/* dst[i] = ((float)src[i] / 255 - mean) / std: torchvision's ToTensor + Normalize */
void mg_k_normalize_u8(float *dst, const uint8_t *src, size_t n, float mean, float std);
void mg_k_relu_mask(float *dx, const float *dy, const float *y, size_t n);
void mg_k_scale(float *x, float a, size_t n);

/* im2col for g samples side by side: col[k][s*P + p] with k = (c*kh + i)*kw + j
 * and P = oh*ow; x points at the first of the g samples (NCHW) */
void mg_k_im2col(float *col, const float *x, int g, int c, int h, int w, int kh, int kw, int stride,
                 int pad, int oh, int ow);
/* the adjoint: dx (g samples, zeroed here) = sum of dcol scattered back */
void mg_k_col2im(float *dx, const float *dcol, int g, int c, int h, int w, int kh, int kw,
                 int stride, int pad, int oh, int ow);
/* dst[c][r] (+)= src[r][c] for an rows x cols matrix */
void mg_k_transpose(float *dst, const float *src, int rows, int cols, int accumulate);
/* Patch rows of one sample in channel-last order: x is [h][w][c] and
 * rows[p][(i*kw + j)*c + ci] = x[o*stride - pad + i][q*stride - pad + j][ci] (0 outside),
 * p = o*ow + q. A kernel row of a patch is then kw*c contiguous values. */
void mg_k_im2row_hwc(float *rows, const float *x, int c, int h, int w, int kh, int kw, int stride,
                     int pad, int oh, int ow);
/* its adjoint: dx [h][w][c] (zeroed here) = drows scattered back */
void mg_k_row2im_hwc(float *dx, const float *drows, int c, int h, int w, int kh, int kw, int stride,
                     int pad, int oh, int ow);
/* out[k] (+)= sum over j < n of g[j] * base[idx[j] * stride + k], for k < len; j in order.
 * With accumulate == 0, out is overwritten (an empty list gives zeros). out must not
 * overlap base. */
void mg_k_gather_axpy(float *out, const float *base, size_t stride, const int32_t *idx,
                      const float *g, int n, int len, int accumulate);
/* y[s][o][p] = out[o][s*P + p] + b[o], relu; the scatter after a grouped conv GEMM */
void mg_k_conv_out(float *y, const float *out, const float *b, int g, int oc, int P, int relu);
/* dyt[o][s*P + p] = dy[s][o][p] (masked by y > 0 when relu; dy is then updated in place
 * so that db and later reads see the masked gradient) */
void mg_k_conv_dy(float *dyt, float *dy, const float *y, int g, int oc, int P, int relu);

void mg_k_maxpool_fwd(float *y, int32_t *idx, const float *x, int planes, int h, int w, int k,
                      int stride, int oh, int ow);
void mg_k_maxpool_bwd(float *dx, const float *dy, const int32_t *idx, int planes, int h, int w,
                      int oh, int ow);

void mg_k_dropout_fwd(float *y, uint8_t *mask, const float *x, size_t n, float p, uint64_t seed,
                      uint64_t offset);
void mg_k_dropout_bwd(float *dx, const float *dy, const uint8_t *mask, size_t n, float p);

void mg_k_xent_fwd(float *loss, int32_t *correct, float *probs, const float *logits,
                   const int32_t *labels, int n, int classes);
void mg_k_xent_bwd(float *dlogits, const float *probs, const int32_t *labels, int n, int classes,
                   float scale);

/* The loss accumulator (backend.h: loss_accumulate; acc's slots in the order
 * of enum mg_loss_acc_slot: step, total, correct, bad step, bad loss). */
void mg_k_loss_acc(double *acc, const float *loss, const int32_t *correct, int n, int close,
                   int64_t step);

void mg_k_sgd(float *p, const float *g, float *buf, size_t n, double lr, double momentum,
              double weight_decay, int nesterov, int first);
void mg_k_adamw(float *p, const float *g, float *m, float *v, size_t n, double lr, double beta1,
                double beta2, double eps, double weight_decay, uint64_t step);

#endif
