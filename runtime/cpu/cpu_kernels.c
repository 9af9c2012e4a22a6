/* The CPU backend's own kernels (see cpu_kernels.h). Built with -O3 and
 * -ffp-contract=off (Makefile): no FMA contraction, so the AVX2 and baseline
 * clones produce identical results. */
#include "cpu_kernels.h"
#include "rng.h"

#include <math.h>
#include <string.h>

MG_CLONES void mg_k_bias_rows(float *y, const float *b, int rows, int cols, int relu)
{
    for (int r = 0; r < rows; r++) {
        float *yr = y + (size_t)r * cols;
        if (b)
            for (int c = 0; c < cols; c++)
                yr[c] += b[c];
        if (relu)
            for (int c = 0; c < cols; c++)
                yr[c] = yr[c] > 0.0f ? yr[c] : 0.0f;
    }
}

MG_CLONES void mg_k_colsum(float *db, const float *dy, int rows, int cols, int accumulate)
{
    if (!accumulate)
        memset(db, 0, sizeof(float) * (size_t)cols);
    for (int r = 0; r < rows; r++) {
        const float *d = dy + (size_t)r * cols;
        for (int c = 0; c < cols; c++)
            db[c] += d[c];
    }
}

MG_CLONES size_t mg_k_count_nonzero(const float *x, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        c += x[i] != 0.0f;
    return c;
}

MG_CLONES float mg_k_sum(const float *x, size_t n)
{
    float acc[16] = {0};
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++)
            acc[j] += x[i + j];
    for (int j = 0; i < n; i++, j++)
        acc[j] += x[i];
    for (int s = 8; s > 0; s /= 2)
        for (int j = 0; j < s; j++)
            acc[j] += acc[j + s];
    return acc[0];
}

MG_CLONES void mg_k_relu(float *y, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

MG_CLONES void mg_k_normalize_u8(float *dst, const uint8_t *src, size_t n, float mean, float std)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = ((float)src[i] / 255.0f - mean) / std;
}

MG_CLONES void mg_k_relu_mask(float *dx, const float *dy, const float *y, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

MG_CLONES void mg_k_scale(float *x, float a, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] *= a;
}

/* Output columns [lo, hi) whose input column o*stride - pad + j lies inside [0, w). */
static inline void valid_range(int j, int stride, int pad, int w, int ow, int *lo, int *hi)
{
    int a = pad - j; /* o*stride >= a */
    int l = a <= 0 ? 0 : (a + stride - 1) / stride;
    int b = w + pad - j; /* o*stride < b */
    int h = b <= 0 ? 0 : (b + stride - 1) / stride;
    if (h > ow)
        h = ow;
    if (l > h)
        l = h;
    *lo = l;
    *hi = h;
}

/* Short rows (8 to 24 floats here): fixed-size chunks become single vector moves. */
static inline void copy_row(float *restrict dst, const float *restrict src, int n)
{
    int q = 0;
    for (; q + 8 <= n; q += 8)
        memcpy(dst + q, src + q, 8 * sizeof(float));
    for (; q < n; q++)
        dst[q] = src[q];
}

static inline void add_row(float *restrict dst, const float *restrict src, int n)
{
    int q = 0;
    for (; q + 8 <= n; q += 8)
        for (int k = 0; k < 8; k++)
            dst[q + k] += src[q + k];
    for (; q < n; q++)
        dst[q] += src[q];
}

MG_CLONES void mg_k_im2col(float *col, const float *x, int g, int c, int h, int w, int kh, int kw,
                           int stride, int pad, int oh, int ow)
{
    size_t P = (size_t)oh * ow, row_len = (size_t)g * P;
    if (stride == 1 && pad == 0) {
        for (int ci = 0; ci < c; ci++)
            for (int i = 0; i < kh; i++)
                for (int j = 0; j < kw; j++) {
                    float *dst_row = col + ((size_t)(ci * kh + i) * kw + j) * row_len;
                    for (int s = 0; s < g; s++) {
                        const float *src = x + ((size_t)s * c + ci) * h * w + (size_t)i * w + j;
                        float *dst = dst_row + (size_t)s * P;
                        for (int o = 0; o < oh; o++)
                            copy_row(dst + (size_t)o * ow, src + (size_t)o * w, ow);
                    }
                }
        return;
    }
    for (int ci = 0; ci < c; ci++)
        for (int i = 0; i < kh; i++)
            for (int j = 0; j < kw; j++) {
                float *dst_row = col + ((size_t)(ci * kh + i) * kw + j) * row_len;
                int lo, hi;
                valid_range(j, stride, pad, w, ow, &lo, &hi);
                for (int s = 0; s < g; s++) {
                    const float *plane = x + ((size_t)s * c + ci) * h * w;
                    float *dst = dst_row + (size_t)s * P;
                    for (int o = 0; o < oh; o++, dst += ow) {
                        int ih = o * stride - pad + i;
                        if (ih < 0 || ih >= h) {
                            memset(dst, 0, sizeof(float) * ow);
                            continue;
                        }
                        const float *src = plane + (size_t)ih * w - pad + j;
                        for (int q = 0; q < lo; q++)
                            dst[q] = 0.0f;
                        if (stride == 1)
                            for (int q = lo; q < hi; q++)
                                dst[q] = src[q];
                        else
                            for (int q = lo; q < hi; q++)
                                dst[q] = src[q * stride];
                        for (int q = hi; q < ow; q++)
                            dst[q] = 0.0f;
                    }
                }
            }
}

MG_CLONES void mg_k_col2im(float *dx, const float *dcol, int g, int c, int h, int w, int kh, int kw,
                           int stride, int pad, int oh, int ow)
{
    size_t P = (size_t)oh * ow, row_len = (size_t)g * P;
    memset(dx, 0, sizeof(float) * (size_t)g * c * h * w);
    if (stride == 1 && pad == 0) {
        for (int ci = 0; ci < c; ci++)
            for (int i = 0; i < kh; i++)
                for (int j = 0; j < kw; j++) {
                    const float *src_row = dcol + ((size_t)(ci * kh + i) * kw + j) * row_len;
                    for (int s = 0; s < g; s++) {
                        float *dst = dx + ((size_t)s * c + ci) * h * w + (size_t)i * w + j;
                        const float *src = src_row + (size_t)s * P;
                        for (int o = 0; o < oh; o++)
                            add_row(dst + (size_t)o * w, src + (size_t)o * ow, ow);
                    }
                }
        return;
    }
    for (int ci = 0; ci < c; ci++)
        for (int i = 0; i < kh; i++)
            for (int j = 0; j < kw; j++) {
                const float *src_row = dcol + ((size_t)(ci * kh + i) * kw + j) * row_len;
                int lo, hi;
                valid_range(j, stride, pad, w, ow, &lo, &hi);
                for (int s = 0; s < g; s++) {
                    float *plane = dx + ((size_t)s * c + ci) * h * w;
                    const float *src = src_row + (size_t)s * P;
                    for (int o = 0; o < oh; o++, src += ow) {
                        int ih = o * stride - pad + i;
                        if (ih < 0 || ih >= h)
                            continue;
                        float *dst = plane + (size_t)ih * w - pad + j;
                        if (stride == 1)
                            for (int q = lo; q < hi; q++)
                                dst[q] += src[q];
                        else
                            for (int q = lo; q < hi; q++)
                                dst[q * stride] += src[q];
                    }
                }
            }
}

MG_CLONES void mg_k_transpose(float *restrict dst, const float *restrict src, int rows, int cols,
                              int accumulate)
{
    /* 8x8 tiles: eight source rows are read together while a destination row of
     * eight is written, so both sides stay within a few cache lines */
    int r0 = 0;
    for (; r0 + 8 <= rows; r0 += 8) {
        const float *s = src + (size_t)r0 * cols;
        for (int c = 0; c < cols; c++) {
            float *d = dst + (size_t)c * rows + r0;
            float v[8];
            for (int k = 0; k < 8; k++)
                v[k] = s[(size_t)k * cols + c];
            if (accumulate)
                for (int k = 0; k < 8; k++)
                    d[k] += v[k];
            else
                for (int k = 0; k < 8; k++)
                    d[k] = v[k];
        }
    }
    for (; r0 < rows; r0++)
        for (int c = 0; c < cols; c++) {
            float v = src[(size_t)r0 * cols + c];
            float *d = dst + (size_t)c * rows + r0;
            *d = accumulate ? *d + v : v;
        }
}

MG_CLONES void mg_k_im2row_hwc(float *restrict rows, const float *restrict x, int c, int h, int w,
                               int kh, int kw, int stride, int pad, int oh, int ow)
{
    size_t K = (size_t)c * kh * kw, seg = (size_t)kw * c;
    for (int o = 0; o < oh; o++)
        for (int q = 0; q < ow; q++) {
            float *dst = rows + ((size_t)o * ow + q) * K;
            int i0 = o * stride - pad, j0 = q * stride - pad;
            int jlo = j0 < 0 ? -j0 : 0, jhi = j0 + kw > w ? w - j0 : kw;
            for (int i = 0; i < kh; i++, dst += seg) {
                int ih = i0 + i;
                if (ih < 0 || ih >= h || jlo >= jhi) {
                    memset(dst, 0, seg * sizeof(float));
                    continue;
                }
                /* kernel columns jlo..jhi of input row ih: jhi-jlo pixels of c channels,
                 * contiguous in channel-last order */
                const float *src = x + ((size_t)ih * w + j0 + jlo) * c;
                size_t n = (size_t)(jhi - jlo) * c;
                for (size_t z = 0; z < (size_t)jlo * c; z++)
                    dst[z] = 0.0f;
                float *d = dst + (size_t)jlo * c;
                size_t t = 0;
                for (; t + 8 <= n; t += 8)
                    memcpy(d + t, src + t, 8 * sizeof(float));
                for (; t < n; t++)
                    d[t] = src[t];
                for (size_t z = (size_t)jhi * c; z < seg; z++)
                    dst[z] = 0.0f;
            }
        }
}

MG_CLONES void mg_k_row2im_hwc(float *restrict dx, const float *restrict drows, int c, int h, int w,
                               int kh, int kw, int stride, int pad, int oh, int ow)
{
    size_t K = (size_t)c * kh * kw, seg = (size_t)kw * c;
    memset(dx, 0, sizeof(float) * (size_t)c * h * w);
    for (int o = 0; o < oh; o++)
        for (int q = 0; q < ow; q++) {
            const float *src = drows + ((size_t)o * ow + q) * K;
            int i0 = o * stride - pad, j0 = q * stride - pad;
            int jlo = j0 < 0 ? -j0 : 0, jhi = j0 + kw > w ? w - j0 : kw;
            for (int i = 0; i < kh; i++, src += seg) {
                int ih = i0 + i;
                if (ih < 0 || ih >= h || jlo >= jhi)
                    continue;
                float *d = dx + ((size_t)ih * w + j0 + jlo) * c;
                const float *s = src + (size_t)jlo * c;
                size_t n = (size_t)(jhi - jlo) * c;
                for (size_t t = 0; t < n; t++)
                    d[t] += s[t];
            }
        }
}

/* Eight-float vectors; the compiler maps them to one AVX register or two SSE ones. */
typedef float v8f __attribute__((vector_size(32), aligned(4), may_alias));

/* Sixteen-float vectors: one AVX-512 register. */
typedef float v16f __attribute__((vector_size(64), aligned(4), may_alias));

/* gather_axpy's blocks of 64 outputs in four AVX-512 registers (the conv's and
 * the mlp's rows are 784 to 800 floats); each output sums its terms in the
 * same order as the 8-wide code, so the bits are the same. Returns how many
 * outputs it did. */
#if MG_HAVE_AVX512_PATH
__attribute__((target("avx512f"))) static int
gather_axpy_512(float *restrict out, const float *restrict base, size_t stride,
                const int32_t *restrict idx, const float *restrict g, int n, int len,
                int accumulate)
{
    int k = 0;
    for (; k + 64 <= len; k += 64) {
        v16f a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
        if (accumulate) {
            a0 = *(const v16f *)(out + k);
            a1 = *(const v16f *)(out + k + 16);
            a2 = *(const v16f *)(out + k + 32);
            a3 = *(const v16f *)(out + k + 48);
        }
        for (int j = 0; j < n; j++) {
            const float *row = base + (size_t)idx[j] * stride + k;
            v16f gj = {g[j], g[j], g[j], g[j], g[j], g[j], g[j], g[j],
                       g[j], g[j], g[j], g[j], g[j], g[j], g[j], g[j]};
            a0 += gj * *(const v16f *)row;
            a1 += gj * *(const v16f *)(row + 16);
            a2 += gj * *(const v16f *)(row + 32);
            a3 += gj * *(const v16f *)(row + 48);
        }
        *(v16f *)(out + k) = a0;
        *(v16f *)(out + k + 16) = a1;
        *(v16f *)(out + k + 32) = a2;
        *(v16f *)(out + k + 48) = a3;
    }
    return k;
}

static int have_avx512(void)
{
    return __builtin_cpu_supports("avx512f");
}
#else
static int gather_axpy_512(float *out, const float *base, size_t stride, const int32_t *idx,
                           const float *g, int n, int len, int accumulate)
{
    return 0;
}

static int have_avx512(void)
{
    return 0;
}
#endif

/* Blocks of 32 outputs stay in four vector registers while the list is walked. */
MG_CLONES void mg_k_gather_axpy(float *restrict out, const float *restrict base, size_t stride,
                                const int32_t *restrict idx, const float *restrict g, int n,
                                int len, int accumulate)
{
    int k = 0;
    if (len >= 64 && have_avx512()) {
        k = gather_axpy_512(out, base, stride, idx, g, n, len, accumulate);
        out += k;
        base += k;
        len -= k;
        k = 0;
    }
    for (; k + 32 <= len; k += 32) {
        v8f a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
        if (accumulate) {
            a0 = *(const v8f *)(out + k);
            a1 = *(const v8f *)(out + k + 8);
            a2 = *(const v8f *)(out + k + 16);
            a3 = *(const v8f *)(out + k + 24);
        }
        for (int j = 0; j < n; j++) {
            const float *row = base + (size_t)idx[j] * stride + k;
            v8f gj = {g[j], g[j], g[j], g[j], g[j], g[j], g[j], g[j]};
            a0 += gj * *(const v8f *)row;
            a1 += gj * *(const v8f *)(row + 8);
            a2 += gj * *(const v8f *)(row + 16);
            a3 += gj * *(const v8f *)(row + 24);
        }
        *(v8f *)(out + k) = a0;
        *(v8f *)(out + k + 8) = a1;
        *(v8f *)(out + k + 16) = a2;
        *(v8f *)(out + k + 24) = a3;
    }
    for (; k + 8 <= len; k += 8) {
        v8f a = {0};
        if (accumulate)
            a = *(const v8f *)(out + k);
        for (int j = 0; j < n; j++) {
            v8f gj = {g[j], g[j], g[j], g[j], g[j], g[j], g[j], g[j]};
            a += gj * *(const v8f *)(base + (size_t)idx[j] * stride + k);
        }
        *(v8f *)(out + k) = a;
    }
    for (; k < len; k++) {
        float a = accumulate ? out[k] : 0.0f;
        for (int j = 0; j < n; j++)
            a += g[j] * base[(size_t)idx[j] * stride + k];
        out[k] = a;
    }
}

MG_CLONES void mg_k_conv_out(float *y, const float *out, const float *b, int g, int oc, int P,
                             int relu)
{
    for (int s = 0; s < g; s++)
        for (int o = 0; o < oc; o++) {
            const float *src = out + (size_t)o * g * P + (size_t)s * P;
            float *dst = y + ((size_t)s * oc + o) * P;
            float bias = b ? b[o] : 0.0f;
            if (relu)
                for (int p = 0; p < P; p++) {
                    float v = src[p] + bias;
                    dst[p] = v > 0.0f ? v : 0.0f;
                }
            else
                for (int p = 0; p < P; p++)
                    dst[p] = src[p] + bias;
        }
}

MG_CLONES void mg_k_conv_dy(float *dyt, float *dy, const float *y, int g, int oc, int P, int relu)
{
    for (int s = 0; s < g; s++)
        for (int o = 0; o < oc; o++) {
            float *src = dy + ((size_t)s * oc + o) * P;
            float *dst = dyt + (size_t)o * g * P + (size_t)s * P;
            if (relu) {
                const float *yy = y + ((size_t)s * oc + o) * P;
                for (int p = 0; p < P; p++) {
                    float v = yy[p] > 0.0f ? src[p] : 0.0f;
                    src[p] = v;
                    dst[p] = v;
                }
            } else {
                memcpy(dst, src, sizeof(float) * P);
            }
        }
}

/* The common 2x2 window with stride 2, branch-free so it vectorizes. */
static inline void maxpool2x2_plane(float *out, int32_t *ix, const float *in, int w, int oh, int ow)
{
    for (int o = 0; o < oh; o++) {
        const float *r0 = in + (size_t)(2 * o) * w, *r1 = r0 + w;
        float *y = out + (size_t)o * ow;
        int32_t *id = ix + (size_t)o * ow;
        int base = 2 * o * w;
        for (int q = 0; q < ow; q++) {
            float a = r0[2 * q], b = r0[2 * q + 1], c = r1[2 * q], d = r1[2 * q + 1];
            int32_t best = base + 2 * q;
            float m = a;
            /* PyTorch's rule: the first maximum wins, a NaN always wins */
            int tb = b > m || b != b;
            m = tb ? b : m;
            best = tb ? base + 2 * q + 1 : best;
            int tc = c > m || c != c;
            m = tc ? c : m;
            best = tc ? base + w + 2 * q : best;
            int td = d > m || d != d;
            m = td ? d : m;
            best = td ? base + w + 2 * q + 1 : best;
            y[q] = m;
            id[q] = best;
        }
    }
}

MG_CLONES void mg_k_maxpool_fwd(float *y, int32_t *idx, const float *x, int planes, int h, int w,
                                int k, int stride, int oh, int ow)
{
    for (int pl = 0; pl < planes; pl++) {
        const float *in = x + (size_t)pl * h * w;
        float *out = y + (size_t)pl * oh * ow;
        int32_t *ix = idx + (size_t)pl * oh * ow;
        if (k == 2 && stride == 2) {
            maxpool2x2_plane(out, ix, in, w, oh, ow);
            continue;
        }
        for (int o = 0; o < oh; o++)
            for (int q = 0; q < ow; q++) {
                int i0 = o * stride, j0 = q * stride;
                int best = i0 * w + j0;
                float m = in[best];
                for (int i = 0; i < k; i++)
                    for (int j = 0; j < k; j++) {
                        int at = (i0 + i) * w + j0 + j;
                        float v = in[at];
                        if (v > m || v != v) {
                            m = v;
                            best = at;
                        }
                    }
                out[o * ow + q] = m;
                ix[o * ow + q] = best;
            }
    }
}

MG_CLONES void mg_k_maxpool_bwd(float *dx, const float *dy, const int32_t *idx, int planes, int h,
                                int w, int oh, int ow)
{
    memset(dx, 0, sizeof(float) * (size_t)planes * h * w);
    for (int pl = 0; pl < planes; pl++) {
        float *d = dx + (size_t)pl * h * w;
        const float *g = dy + (size_t)pl * oh * ow;
        const int32_t *ix = idx + (size_t)pl * oh * ow;
        for (int i = 0; i < oh * ow; i++)
            d[ix[i]] += g[i];
    }
}

void mg_k_dropout_fwd(float *y, uint8_t *mask, const float *x, size_t n, float p, uint64_t seed,
                      uint64_t offset)
{
    /* keep when a 24-bit uniform in [0,1) is >= p */
    uint32_t threshold = (uint32_t)ceil((double)p * 16777216.0);
    float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
    for (size_t i = 0; i < n; i++) {
        uint32_t r = mg_rng_counter_u32(seed, offset + i) >> 8;
        uint8_t keep = r >= threshold;
        mask[i] = keep;
        y[i] = keep ? x[i] * scale : 0.0f;
    }
}

MG_CLONES void mg_k_dropout_bwd(float *dx, const float *dy, const uint8_t *mask, size_t n, float p)
{
    float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
    for (size_t i = 0; i < n; i++)
        dx[i] = mask[i] ? dy[i] * scale : 0.0f;
}

void mg_k_xent_fwd(float *loss, int32_t *correct, float *probs, const float *logits,
                   const int32_t *labels, int n, int classes)
{
    for (int i = 0; i < n; i++) {
        const float *z = logits + (size_t)i * classes;
        float *pr = probs + (size_t)i * classes;
        int arg = 0;
        float m = z[0];
        for (int c = 1; c < classes; c++)
            if (z[c] > m) {
                m = z[c];
                arg = c;
            }
        float s = 0.0f;
        for (int c = 0; c < classes; c++) {
            pr[c] = expf(z[c] - m);
            s += pr[c];
        }
        float inv = 1.0f / s;
        for (int c = 0; c < classes; c++)
            pr[c] *= inv;
        loss[i] = (m + logf(s)) - z[labels[i]];
        correct[i] = arg == labels[i];
    }
}

void mg_k_xent_bwd(float *dlogits, const float *probs, const int32_t *labels, int n, int classes,
                   float scale)
{
    for (int i = 0; i < n; i++) {
        const float *pr = probs + (size_t)i * classes;
        float *d = dlogits + (size_t)i * classes;
        for (int c = 0; c < classes; c++)
            d[c] = (pr[c] - (c == labels[i] ? 1.0f : 0.0f)) * scale;
    }
}

/* What the trainer summed on the host after each micro-batch's download, before
 * the sums stayed on the device: a double from 0, sample by sample; then the
 * micro-batches of a step, then the steps. */
void mg_k_loss_acc(double *acc, const float *loss, const int32_t *correct, int n, int close,
                   int64_t step)
{
    double s = 0.0;
    int64_t c = 0;
    for (int i = 0; i < n; i++) {
        s += loss[i];
        c += correct[i];
    }
    acc[0] += s;
    acc[2] += (double)c;
    if (close) {
        if (!isfinite(acc[0]) && acc[3] == 0.0) {
            acc[3] = (double)step;
            acc[4] = acc[0];
        }
        acc[1] += acc[0];
        acc[0] = 0.0;
    }
}

/* torch.optim.SGD, single-tensor path: d = g + wd*p; buf = m*buf + d (buf = d on the
 * first step); d = nesterov ? d + m*buf : buf; p = p - lr*d. Scalars are rounded to
 * float as PyTorch does for a float32 tensor. */
MG_CLONES void mg_k_sgd(float *p, const float *g, float *buf, size_t n, double lr, double momentum,
                        double weight_decay, int nesterov, int first)
{
    float wd = (float)weight_decay, m = (float)momentum, neg_lr = (float)-lr;
    for (size_t i = 0; i < n; i++) {
        float d = g[i];
        if (weight_decay != 0.0)
            d = d + wd * p[i];
        if (momentum != 0.0) {
            float b = first ? d : buf[i] * m + d;
            buf[i] = b;
            d = nesterov ? d + m * b : b;
        }
        p[i] = p[i] + neg_lr * d;
    }
}

/* torch.optim.AdamW (amsgrad off), single-tensor path. */
MG_CLONES void mg_k_adamw(float *p, const float *g, float *m, float *v, size_t n, double lr,
                          double beta1, double beta2, double eps, double weight_decay,
                          uint64_t step)
{
    double bc1 = 1.0 - pow(beta1, (double)step);
    double bc2 = 1.0 - pow(beta2, (double)step);
    float decay = (float)(1.0 - lr * weight_decay);
    float b1 = (float)beta1, b2 = (float)beta2;
    float a1 = (float)(1.0 - beta1), a2 = (float)(1.0 - beta2);
    float bc2_sqrt = (float)sqrt(bc2), e = (float)eps;
    float neg_step = (float)-(lr / bc1);
    for (size_t i = 0; i < n; i++) {
        float gi = g[i];
        float pi = p[i] * decay;
        float mi = m[i] * b1 + a1 * gi;
        float vi = v[i] * b2 + a2 * gi * gi;
        float denom = sqrtf(vi) / bc2_sqrt + e;
        m[i] = mi;
        v[i] = vi;
        p[i] = pi + neg_step * (mi / denom);
    }
}
