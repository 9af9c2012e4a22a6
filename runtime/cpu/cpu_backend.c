/* The CPU compute backend: OpenBLAS sgemm for the matrix products (linear and
 * im2col convolution), cpu_kernels.c for everything else. Single-threaded
 * except inside BLAS, which gets `threads` threads. */
#include "backend.h"
#include "blas.h"
#include "cpu_kernels.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct cpu_impl {
    char name[256];
    const struct mg_blas *blas;
};

/* Row-major C = A . B (+ beta C) through the loaded BLAS; ta/tb transpose A/B. */
static inline void gemm(struct mg_backend *be, int ta, int tb, int m, int n, int k, const float *a,
                        int lda, const float *b, int ldb, float beta, float *c, int ldc)
{
    const struct cpu_impl *impl = be->impl;
    impl->blas->sgemm(MG_BLAS_ROW_MAJOR, ta ? MG_BLAS_TRANS : MG_BLAS_NO_TRANS,
                      tb ? MG_BLAS_TRANS : MG_BLAS_NO_TRANS, m, n, k, 1.0f, a, lda, b, ldb, beta, c,
                      ldc);
}

/* Conv activations are processed in groups of samples whose im2col matrix
 * takes about this many bytes (it stays in L2 between im2col and the GEMM).
 * A constant, not a cache probe: the grouping decides the summation order of
 * the weight gradient, so it must not vary between machines. */
#define CONV_GROUP_BYTES (1u << 20)

/* Zero-filled, 64-byte aligned: calloc's block, with its pointer kept just
 * in front of ours. calloc leaves the kernel's fresh pages as they come
 * (zero, and not yet mapped) where a memset would touch every one: the
 * activation arena alone is tens of MB, and a start paid ~10 ms to fault it
 * all in before the first step had touched what it uses. */
static void *cpu_alloc(struct mg_backend *be, size_t bytes)
{
    if (bytes == 0)
        bytes = 64;
    bytes = (bytes + 63) & ~(size_t)63;
    if (bytes > SIZE_MAX - 128)
        return NULL;
    char *raw = calloc(1, bytes + 128);
    if (!raw)
        return NULL;
    char *p = (char *)(((uintptr_t)raw + 64 + 63) & ~(uintptr_t)63);
    memcpy(p - sizeof(raw), &raw, sizeof(raw));
    return p;
}

static void cpu_free(struct mg_backend *be, void *p)
{
    char *raw;
    if (!p)
        return;
    memcpy(&raw, (char *)p - sizeof(raw), sizeof(raw));
    free(raw);
}

static void cpu_copy(struct mg_backend *be, void *dst, const void *src, size_t bytes)
{
    if (dst != src && bytes)
        memmove(dst, src, bytes);
}

static void cpu_zero(struct mg_backend *be, void *p, size_t bytes)
{
    memset(p, 0, bytes);
}

static int cpu_sync(struct mg_backend *be)
{
    return 0;
}

static void cpu_linear_forward(struct mg_backend *be, float *y, const float *x, const float *w,
                               const float *b, int n, int in, int out, int relu)
{
    gemm(be, 0, 1, n, out, in, x, in, w, in, 0.0f, y, out);
    mg_k_bias_rows(y, b, n, out, relu);
}

/* unit lists (index, value) [out][n] | sample lists (index, value) [n][out] | lengths */
static size_t cpu_linear_scratch(struct mg_backend *be, int n, int in, int out)
{
    return 4 * (size_t)n * out * 4 + ((size_t)n + out) * 4;
}

/* A gradient behind a ReLU is often mostly zeros (the mlp's hidden layer keeps under
 * a tenth of its units active once trained): below this density the products skip
 * the zeros, gathering only the rows they touch. Dense GEMM wins above it. */
#define LINEAR_SPARSE_DENSITY 0.25

static void linear_backward_sparse(float *dx, float *dw, const float *dy, const float *x,
                                   const float *w, int n, int in, int out, int accumulate,
                                   void *scratch)
{
    int32_t *u_idx = scratch; /* [out][n]: samples where unit o has a gradient */
    float *u_val = (float *)(u_idx + (size_t)out * n);
    int32_t *s_idx = (int32_t *)(u_val + (size_t)out * n); /* [n][out]: units of sample i */
    float *s_val = (float *)(s_idx + (size_t)out * n);
    int32_t *u_n = (int32_t *)(s_val + (size_t)out * n), *s_n = u_n + out;
    memset(u_n, 0, sizeof(int32_t) * (size_t)out);
    for (int i = 0; i < n; i++) {
        int cnt = 0;
        for (int o = 0; o < out; o++) {
            float v = dy[(size_t)i * out + o];
            int nz = v != 0.0f;
            u_idx[(size_t)o * n + u_n[o]] = i;
            u_val[(size_t)o * n + u_n[o]] = v;
            u_n[o] += nz;
            s_idx[(size_t)i * out + cnt] = o;
            s_val[(size_t)i * out + cnt] = v;
            cnt += nz;
        }
        s_n[i] = cnt;
    }
    for (int o = 0; o < out; o++)
        mg_k_gather_axpy(dw + (size_t)o * in, x, (size_t)in, u_idx + (size_t)o * n,
                         u_val + (size_t)o * n, u_n[o], in, accumulate);
    if (dx)
        for (int i = 0; i < n; i++)
            mg_k_gather_axpy(dx + (size_t)i * in, w, (size_t)in, s_idx + (size_t)i * out,
                             s_val + (size_t)i * out, s_n[i], in, 0);
}

static void cpu_linear_backward(struct mg_backend *be, float *dx, float *dw, float *db,
                                const float *dy, const float *x, const float *w, int n, int in,
                                int out, int accumulate, void *scratch)
{
    /* dw[out][in] (+)= dy^T x ; db (+)= column sums of dy ; dx = dy w */
    if (db)
        mg_k_colsum(db, dy, n, out, accumulate);
    size_t total = (size_t)n * out;
    if (scratch && in >= 32 &&
        (double)mg_k_count_nonzero(dy, total) < LINEAR_SPARSE_DENSITY * (double)total) {
        linear_backward_sparse(dx, dw, dy, x, w, n, in, out, accumulate, scratch);
        return;
    }
    gemm(be, 1, 0, out, in, n, dy, out, x, in, accumulate ? 1.0f : 0.0f, dw, in);
    if (dx)
        gemm(be, 0, 0, n, in, out, dy, out, w, in, 0.0f, dx, in);
}

static int conv_group(const struct mg_conv2d_dims *d)
{
    size_t per = (size_t)d->c * d->kh * d->kw * d->oh * d->ow * sizeof(float);
    size_t g = CONV_GROUP_BYTES / (per ? per : 1);
    if (g < 1)
        g = 1;
    if (g > (size_t)d->n)
        g = (size_t)d->n;
    return (int)g;
}

/* dense: col [K][G*P] | out/dyt [OC][G*P] | dcol [K][G*P]
 * sparse backward: rows [P][K] | drows [P][K] | x, dx channel-last [C*H*W] each
 *                  | w, dw channel-last [OC][K] each | per-channel lists (index, value)
 *                  [OC][P] | per-position lists (index, value) [P][OC] | lengths [OC + P] */
static size_t cpu_conv2d_scratch(struct mg_backend *be, const struct mg_conv2d_dims *d)
{
    size_t P = (size_t)d->oh * d->ow, gp = (size_t)conv_group(d) * P;
    size_t k = (size_t)d->c * d->kh * d->kw;
    size_t dense = (2 * k + (size_t)d->oc) * gp * sizeof(float);
    size_t in = (size_t)d->c * d->h * d->w;
    size_t sparse = (2 * P * k + 2 * in + 2 * (size_t)d->oc * k) * sizeof(float) +
                    4 * (size_t)d->oc * P * 4 + (d->oc + P) * 4;
    return dense > sparse ? dense : sparse;
}

static void cpu_conv2d_forward(struct mg_backend *be, const struct mg_conv2d_dims *d, float *y,
                               const float *x, const float *w, const float *b, int relu,
                               void *scratch)
{
    int G = conv_group(d), P = d->oh * d->ow, K = d->c * d->kh * d->kw;
    size_t in_size = (size_t)d->c * d->h * d->w, out_size = (size_t)d->oc * P;
    float *col = scratch, *out = col + (size_t)K * G * P;
    for (int n0 = 0; n0 < d->n; n0 += G) {
        int g = d->n - n0 < G ? d->n - n0 : G;
        mg_k_im2col(col, x + n0 * in_size, g, d->c, d->h, d->w, d->kh, d->kw, d->stride, d->pad,
                    d->oh, d->ow);
        gemm(be, 0, 0, d->oc, g * P, K, w, K, col, g * P, 0.0f, out, g * P);
        mg_k_conv_out(y + n0 * out_size, out, b, g, d->oc, P, relu);
    }
}

/* The backward when most of dy is zero (ReLU + max-pool after the conv keep at most
 * a quarter of it): per sample, the nonzero gradients are listed per output channel
 * (for dw) and per position (for dx), and only those patch rows and weight rows are
 * combined: about 4x fewer multiply-adds than the dense GEMMs. Patches are built in
 * channel-last order, where each kernel row is one contiguous run (the input, the
 * weights and dw are transposed to and from that order once per call or sample). */
static void conv2d_backward_sparse(const struct mg_conv2d_dims *d, float *dx, float *dw, float *db,
                                   float *dy, const float *x, const float *w, const float *y,
                                   int relu, int accumulate, void *scratch)
{
    int P = d->oh * d->ow, K = d->c * d->kh * d->kw, OC = d->oc, KK = d->kh * d->kw;
    int HW = d->h * d->w;
    size_t in_size = (size_t)d->c * HW, out_size = (size_t)OC * P;
    float *rows = scratch, *drows = rows + (size_t)P * K;
    float *xt = drows + (size_t)P * K, *dxt = xt + in_size; /* [h][w][c] */
    float *wt = dxt + in_size, *dwt = wt + (size_t)OC * K;  /* [oc][kh][kw][c] */
    int32_t *ch_idx = (int32_t *)(dwt + (size_t)OC * K);    /* [OC][P] positions */
    float *ch_val = (float *)(ch_idx + (size_t)OC * P);
    int32_t *pos_idx = (int32_t *)(ch_val + (size_t)OC * P); /* [P][OC] channels */
    float *pos_val = (float *)(pos_idx + (size_t)OC * P);
    int32_t *ch_n = (int32_t *)(pos_val + (size_t)OC * P), *pos_n = ch_n + OC;

    for (int o = 0; o < OC; o++)
        mg_k_transpose(wt + (size_t)o * K, w + (size_t)o * K, d->c, KK, 0);
    memset(dwt, 0, sizeof(float) * (size_t)OC * K);
    if (db && !accumulate)
        memset(db, 0, sizeof(float) * (size_t)OC);
    for (int s = 0; s < d->n; s++) {
        float *g = dy + s * out_size;
        const float *ys = y ? y + s * out_size : NULL;
        memset(pos_n, 0, sizeof(int32_t) * (size_t)P);
        for (int o = 0; o < OC; o++) {
            int cnt = 0;
            float bsum = 0.0f;
            /* branch-free compaction: three quarters are zeros, in no pattern a
             * branch predictor could follow */
            for (int p = 0; p < P; p++) {
                float v = g[(size_t)o * P + p];
                if (relu) {
                    v = ys[(size_t)o * P + p] > 0.0f ? v : 0.0f;
                    g[(size_t)o * P + p] = v;
                }
                int nz = v != 0.0f;
                bsum += v;
                ch_idx[(size_t)o * P + cnt] = p;
                ch_val[(size_t)o * P + cnt] = v;
                cnt += nz;
                pos_idx[(size_t)p * OC + pos_n[p]] = o;
                pos_val[(size_t)p * OC + pos_n[p]] = v;
                pos_n[p] += nz;
            }
            ch_n[o] = cnt;
            if (db)
                db[o] += bsum;
        }
        mg_k_transpose(xt, x + s * in_size, d->c, HW, 0);
        mg_k_im2row_hwc(rows, xt, d->c, d->h, d->w, d->kh, d->kw, d->stride, d->pad, d->oh, d->ow);
        for (int o = 0; o < OC; o++)
            if (ch_n[o])
                mg_k_gather_axpy(dwt + (size_t)o * K, rows, (size_t)K, ch_idx + (size_t)o * P,
                                 ch_val + (size_t)o * P, ch_n[o], K, 1);
        if (dx) {
            for (int p = 0; p < P; p++)
                mg_k_gather_axpy(drows + (size_t)p * K, wt, (size_t)K, pos_idx + (size_t)p * OC,
                                 pos_val + (size_t)p * OC, pos_n[p], K, 0);
            mg_k_row2im_hwc(dxt, drows, d->c, d->h, d->w, d->kh, d->kw, d->stride, d->pad, d->oh,
                            d->ow);
            mg_k_transpose(dx + s * in_size, dxt, HW, d->c, 0);
        }
    }
    for (int o = 0; o < OC; o++)
        mg_k_transpose(dw + (size_t)o * K, dwt + (size_t)o * K, KK, d->c, accumulate);
}

static void cpu_conv2d_backward(struct mg_backend *be, const struct mg_conv2d_dims *d, float *dx,
                                float *dw, float *db, float *dy, const float *x, const float *w,
                                const float *y, int relu, int accumulate, int sparse_dy,
                                void *scratch)
{
    /* the sparse kernel works on rows of K values: worth it when they fill vectors */
    if (sparse_dy && d->c * d->kh * d->kw >= 64) {
        conv2d_backward_sparse(d, dx, dw, db, dy, x, w, y, relu, accumulate, scratch);
        return;
    }
    int G = conv_group(d), P = d->oh * d->ow, K = d->c * d->kh * d->kw;
    size_t in_size = (size_t)d->c * d->h * d->w, out_size = (size_t)d->oc * P;
    float *col = scratch, *dyt = col + (size_t)K * G * P, *dcol = dyt + (size_t)d->oc * G * P;
    for (int n0 = 0; n0 < d->n; n0 += G) {
        int g = d->n - n0 < G ? d->n - n0 : G;
        mg_k_conv_dy(dyt, dy + n0 * out_size, y ? y + n0 * out_size : NULL, g, d->oc, P, relu);
        mg_k_im2col(col, x + n0 * in_size, g, d->c, d->h, d->w, d->kh, d->kw, d->stride, d->pad,
                    d->oh, d->ow);
        /* dw[oc][K] += dyt[oc][gP] col[K][gP]^T */
        gemm(be, 0, 1, d->oc, K, g * P, dyt, g * P, col, g * P,
             n0 == 0 && !accumulate ? 0.0f : 1.0f, dw, K);
        if (dx) {
            /* dcol[K][gP] = w[oc][K]^T dyt[oc][gP] */
            gemm(be, 1, 0, K, g * P, d->oc, w, K, dyt, g * P, 0.0f, dcol, g * P);
            mg_k_col2im(dx + n0 * in_size, dcol, g, d->c, d->h, d->w, d->kh, d->kw, d->stride,
                        d->pad, d->oh, d->ow);
        }
    }
    if (db) {
        if (!accumulate)
            memset(db, 0, sizeof(float) * (size_t)d->oc);
        for (int s = 0; s < d->n; s++)
            for (int o = 0; o < d->oc; o++)
                db[o] += mg_k_sum(dy + s * out_size + (size_t)o * P, (size_t)P);
    }
}

static void cpu_maxpool2d_forward(struct mg_backend *be, const struct mg_pool2d_dims *d, float *y,
                                  int32_t *idx, const float *x)
{
    mg_k_maxpool_fwd(y, idx, x, d->n * d->c, d->h, d->w, d->k, d->stride, d->oh, d->ow);
}

static void cpu_maxpool2d_backward(struct mg_backend *be, const struct mg_pool2d_dims *d, float *dx,
                                   const float *dy, const int32_t *idx)
{
    mg_k_maxpool_bwd(dx, dy, idx, d->n * d->c, d->h, d->w, d->oh, d->ow);
}

static void cpu_relu_forward(struct mg_backend *be, float *y, const float *x, size_t n)
{
    mg_k_relu(y, x, n);
}

static void cpu_relu_backward(struct mg_backend *be, float *dx, const float *dy, const float *y,
                              size_t n)
{
    mg_k_relu_mask(dx, dy, y, n);
}

static void cpu_dropout_forward(struct mg_backend *be, float *y, uint8_t *mask, const float *x,
                                size_t n, float p, uint64_t seed, uint64_t offset)
{
    mg_k_dropout_fwd(y, mask, x, n, p, seed, offset);
}

static void cpu_dropout_backward(struct mg_backend *be, float *dx, const float *dy,
                                 const uint8_t *mask, size_t n, float p)
{
    mg_k_dropout_bwd(dx, dy, mask, n, p);
}

static void cpu_xent_forward(struct mg_backend *be, float *loss, int32_t *correct, float *probs,
                             const float *logits, const int32_t *labels, int n, int classes)
{
    mg_k_xent_fwd(loss, correct, probs, logits, labels, n, classes);
}

_Static_assert(MG_ACC_STEP == 0 && MG_ACC_TOTAL == 1 && MG_ACC_CORRECT == 2 &&
                   MG_ACC_BAD_STEP == 3 && MG_ACC_BAD_LOSS == 4 && MG_ACC_LEN == 5,
               "mg_k_loss_acc's slots");

static void cpu_loss_accumulate(struct mg_backend *be, double *acc, const float *loss,
                                const int32_t *correct, int n, int close, int64_t step)
{
    mg_k_loss_acc(acc, loss, correct, n, close, step);
}

static void cpu_xent_backward(struct mg_backend *be, float *dlogits, const float *probs,
                              const int32_t *labels, int n, int classes, float scale)
{
    mg_k_xent_bwd(dlogits, probs, labels, n, classes, scale);
}

static void cpu_sgd_step(struct mg_backend *be, float *p, const float *g, float *buf, size_t n,
                         double lr, double momentum, double weight_decay, int nesterov, int first)
{
    mg_k_sgd(p, g, buf, n, lr, momentum, weight_decay, nesterov, first);
}

static void cpu_adamw_step(struct mg_backend *be, float *p, const float *g, float *m, float *v,
                           size_t n, double lr, double beta1, double beta2, double eps,
                           double weight_decay, uint64_t step)
{
    mg_k_adamw(p, g, m, v, n, lr, beta1, beta2, eps, weight_decay, step);
}

static void cpu_scale(struct mg_backend *be, float *x, float a, size_t n)
{
    mg_k_scale(x, a, n);
}

static void cpu_release(struct mg_backend *be)
{
    free(be->impl);
    free(be);
}

static int threads_from_env(void)
{
    const char *s = getenv("OMP_NUM_THREADS");
    if (!s || !*s)
        return 1;
    char *end;
    long v = strtol(s, &end, 10);
    /* OMP_NUM_THREADS may be a list ("4,2"): the first level counts */
    if (end == s || v < 1 || (*end && *end != ','))
        return 1;
    return v > 1024 ? 1024 : (int)v;
}

static const struct mg_backend_ops cpu_ops = {
    .release = cpu_release,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .copy = cpu_copy,
    .zero = cpu_zero,
    .sync = cpu_sync,
    .linear_forward = cpu_linear_forward,
    .linear_scratch = cpu_linear_scratch,
    .linear_backward = cpu_linear_backward,
    .conv2d_scratch = cpu_conv2d_scratch,
    .conv2d_forward = cpu_conv2d_forward,
    .conv2d_backward = cpu_conv2d_backward,
    .maxpool2d_forward = cpu_maxpool2d_forward,
    .maxpool2d_backward = cpu_maxpool2d_backward,
    .relu_forward = cpu_relu_forward,
    .relu_backward = cpu_relu_backward,
    .dropout_forward = cpu_dropout_forward,
    .dropout_backward = cpu_dropout_backward,
    .xent_forward = cpu_xent_forward,
    .xent_backward = cpu_xent_backward,
    .loss_accumulate = cpu_loss_accumulate,
    .sgd_step = cpu_sgd_step,
    .adamw_step = cpu_adamw_step,
    .scale = cpu_scale,
};

int mg_cpu_backend_create(const struct mg_backend_opts *opts, struct mg_backend **out, char *err,
                          size_t errlen)
{
    char msg[MG_ERRMSG_LEN];
    struct mg_backend *be = calloc(1, sizeof(*be));
    struct cpu_impl *impl = calloc(1, sizeof(*impl));
    if (!be || !impl) {
        free(be);
        free(impl);
        return -ENOMEM;
    }
    int threads = opts && opts->threads > 0 ? opts->threads : threads_from_env();
    int rc = mg_blas_load(threads, &impl->blas, msg);
    if (rc < 0) {
        free(be);
        free(impl);
        return mg_seterr(err, errlen, rc, "%s", msg);
    }
    char what[sizeof(impl->name) - 8];
    mg_blas_describe(impl->blas, threads, what, sizeof(what));
    snprintf(impl->name, sizeof(impl->name), "cpu (%s)", what);
    *be = (struct mg_backend){
        .ops = &cpu_ops,
        .name = impl->name,
        .device = MG_DEVICE_CPU,
        .threads = threads,
        .impl = impl,
    };
    *out = be;
    return 0;
}
