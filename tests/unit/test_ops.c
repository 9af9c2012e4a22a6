/* The CPU backend's ops against straightforward double-precision loops:
 * linear, conv2d (stride, padding, several sample groups), maxpool (ties,
 * NaN, overlapping windows), relu, dropout, softmax cross-entropy, SGD and
 * AdamW, including the accumulate and skip-dx variants.
 * timeout: 60 */
#include "backend.h"
#include "cpu_kernels.h"
#include "mg_err.h"
#include "rng.h"
#include "tap.h"

#include <stdint.h>

static struct mg_backend *be;
static struct mg_mt19937 gen;

static float *randv(size_t n, float scale)
{
    float *v = malloc(n * sizeof(float) + 4);
    for (size_t i = 0; i < n; i++)
        v[i] = ((float)(mg_mt19937_u32(&gen) >> 8) / 16777216.0f * 2.0f - 1.0f) * scale;
    return v;
}

static float *copyv(const float *x, size_t n)
{
    float *v = malloc(n * sizeof(float) + 4);
    memcpy(v, x, n * sizeof(float));
    return v;
}

/* largest |got - want| / (1 + |want|) */
static double maxdiff(const float *got, const double *want, size_t n)
{
    double w = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs(got[i] - want[i]) / (1.0 + fabs(want[i]));
        if (d > w || d != d)
            w = d != d ? INFINITY : d;
    }
    return w;
}

static void test_linear(int n, int in, int out, int relu, int sparse)
{
    float *x = randv((size_t)n * in, 1), *w = randv((size_t)out * in, 0.5f), *b = randv(out, 0.5f);
    float *y = randv((size_t)n * out, 1), *dy = randv((size_t)n * out, 1);
    float *dx = randv((size_t)n * in, 1), *dw0 = randv((size_t)out * in, 1), *db0 = randv(out, 1);
    float *dw = copyv(dw0, (size_t)out * in), *db = copyv(db0, out);
    double *ry = calloc((size_t)n * out, sizeof(double)), *rdx = calloc((size_t)n * in, 8);
    double *rdw = calloc((size_t)out * in, 8), *rdb = calloc(out, 8);
    be->ops->linear_forward(be, y, x, w, b, n, in, out, relu);
    for (int i = 0; i < n; i++)
        for (int o = 0; o < out; o++) {
            double s = b[o];
            for (int k = 0; k < in; k++)
                s += (double)x[i * in + k] * w[o * in + k];
            ry[i * out + o] = relu && s < 0 ? 0 : s;
        }
    ok(maxdiff(y, ry, (size_t)n * out) < 1e-5, "linear %dx%d->%d%s forward: %.2g", n, in, out,
       relu ? " +relu" : "", maxdiff(y, ry, (size_t)n * out));
    /* accumulate: dw = dw0 + dy^T x */
    void *scratch = be->ops->alloc(be, be->ops->linear_scratch(be, n, in, out));
    if (sparse) /* nine tenths zeros, as behind a trained ReLU layer: the sparse path */
        for (size_t i = 0; i < (size_t)n * out; i++)
            if (i % 10)
                dy[i] = 0.0f;
    be->ops->linear_backward(be, dx, dw, db, dy, x, w, n, in, out, 1, scratch);
    for (int o = 0; o < out; o++) {
        rdb[o] = db0[o];
        for (int k = 0; k < in; k++)
            rdw[o * in + k] = dw0[o * in + k];
        for (int i = 0; i < n; i++) {
            rdb[o] += dy[i * out + o];
            for (int k = 0; k < in; k++)
                rdw[o * in + k] += (double)dy[i * out + o] * x[i * in + k];
        }
    }
    for (int i = 0; i < n; i++)
        for (int k = 0; k < in; k++) {
            double s = 0;
            for (int o = 0; o < out; o++)
                s += (double)dy[i * out + o] * w[o * in + k];
            rdx[i * in + k] = s;
        }
    const char *how = sparse ? " (sparse dy)" : "";
    ok(maxdiff(dw, rdw, (size_t)out * in) < 1e-5, "linear backward dw (accumulate)%s", how);
    ok(maxdiff(db, rdb, out) < 1e-5, "linear backward db (accumulate)%s", how);
    ok(maxdiff(dx, rdx, (size_t)n * in) < 1e-5, "linear backward dx%s", how);
    /* overwrite, without dx */
    float *dx_before = copyv(dx, (size_t)n * in);
    be->ops->linear_backward(be, NULL, dw, db, dy, x, w, n, in, out, 0, scratch);
    be->ops->free(be, scratch);
    for (size_t i = 0; i < (size_t)out * in; i++)
        rdw[i] -= dw0[i];
    for (int o = 0; o < out; o++)
        rdb[o] -= db0[o];
    ok(maxdiff(dw, rdw, (size_t)out * in) < 1e-5 && maxdiff(db, rdb, out) < 1e-5,
       "linear backward overwrites with accumulate=0%s", how);
    ok(!memcmp(dx, dx_before, (size_t)n * in * sizeof(float)), "dx == NULL skips dx%s", how);
    free(x), free(w), free(b), free(y), free(dy), free(dx), free(dw0), free(db0), free(dw);
    free(db), free(ry), free(rdx), free(rdw), free(rdb), free(dx_before);
}

static double conv_x(const float *x, const struct mg_conv2d_dims *d, int s, int c, int ih, int iw)
{
    if (ih < 0 || iw < 0 || ih >= d->h || iw >= d->w)
        return 0.0;
    return x[(((size_t)s * d->c + c) * d->h + ih) * d->w + iw];
}

static void test_conv(int n, int c, int h, int w, int oc, int k, int stride, int pad, int relu,
                      int sparse)
{
    struct mg_conv2d_dims d = {
        .n = n, .c = c, .h = h, .w = w, .oc = oc, .kh = k, .kw = k, .stride = stride, .pad = pad};
    is_int(mg_conv2d_dims_finish(&d), 0, "conv dims");
    size_t nx = (size_t)n * c * h * w, nw = (size_t)oc * c * k * k;
    size_t ny = (size_t)n * oc * d.oh * d.ow, P = (size_t)d.oh * d.ow;
    float *x = randv(nx, 1), *wt = randv(nw, 0.3f), *b = randv(oc, 0.3f), *y = randv(ny, 1);
    float *dy = randv(ny, 1), *dy0 = copyv(dy, ny), *dx = randv(nx, 1);
    float *dw = randv(nw, 1), *db = randv(oc, 1), *dw0 = copyv(dw, nw), *db0 = copyv(db, oc);
    void *scratch = be->ops->alloc(be, be->ops->conv2d_scratch(be, &d));
    double *ry = calloc(ny, 8), *rdx = calloc(nx, 8), *rdw = calloc(nw, 8), *rdb = calloc(oc, 8);
    char what[96];
    snprintf(what, sizeof(what), "conv n%d c%d %dx%d oc%d k%d s%d p%d%s", n, c, h, w, oc, k, stride,
             pad, relu ? " +relu" : "");

    be->ops->conv2d_forward(be, &d, y, x, wt, b, relu, scratch);
    for (int s = 0; s < n; s++)
        for (int o = 0; o < oc; o++)
            for (int i = 0; i < d.oh; i++)
                for (int j = 0; j < d.ow; j++) {
                    double acc = b[o];
                    for (int ci = 0; ci < c; ci++)
                        for (int a = 0; a < k; a++)
                            for (int e = 0; e < k; e++)
                                acc += wt[((o * c + ci) * k + a) * k + e] *
                                       conv_x(x, &d, s, ci, i * stride - pad + a,
                                              j * stride - pad + e);
                    ry[((size_t)s * oc + o) * P + i * d.ow + j] = relu && acc < 0 ? 0 : acc;
                }
    ok(maxdiff(y, ry, ny) < 1e-5, "%s forward: %.2g", what, maxdiff(y, ry, ny));

    /* masked gradient the backward must use when relu is fused */
    for (size_t i = 0; i < ny; i++)
        if (relu && !(y[i] > 0))
            dy0[i] = 0;
    for (int s = 0; s < n; s++)
        for (int o = 0; o < oc; o++)
            for (int i = 0; i < d.oh; i++)
                for (int j = 0; j < d.ow; j++) {
                    double g = dy0[((size_t)s * oc + o) * P + i * d.ow + j];
                    rdb[o] += g;
                    for (int ci = 0; ci < c; ci++)
                        for (int a = 0; a < k; a++)
                            for (int e = 0; e < k; e++) {
                                int ih = i * stride - pad + a, iw = j * stride - pad + e;
                                if (ih < 0 || iw < 0 || ih >= h || iw >= w)
                                    continue;
                                size_t xi = (((size_t)s * c + ci) * h + ih) * w + iw;
                                rdw[((o * c + ci) * k + a) * k + e] += g * x[xi];
                                rdx[xi] += g * wt[((o * c + ci) * k + a) * k + e];
                            }
                }
    be->ops->conv2d_backward(be, &d, dx, dw, db, dy, x, wt, y, relu, 0, sparse, scratch);
    ok(maxdiff(dw, rdw, nw) < 1e-4, "%s backward dw: %.2g", what, maxdiff(dw, rdw, nw));
    ok(maxdiff(db, rdb, oc) < 1e-5, "%s backward db", what);
    ok(maxdiff(dx, rdx, nx) < 1e-5, "%s backward dx: %.2g", what, maxdiff(dx, rdx, nx));
    /* a second backward accumulates into dw/db */
    memcpy(dw0, dw, nw * sizeof(float));
    memcpy(db0, db, oc * sizeof(float));
    be->ops->conv2d_backward(be, &d, NULL, dw, db, dy, x, wt, y, relu, 1, sparse, scratch);
    for (size_t i = 0; i < nw; i++)
        rdw[i] *= 2;
    for (int o = 0; o < oc; o++)
        rdb[o] *= 2;
    ok(maxdiff(dw, rdw, nw) < 1e-4 && maxdiff(db, rdb, oc) < 1e-5, "%s accumulates", what);
    be->ops->free(be, scratch);
    free(x), free(wt), free(b), free(y), free(dy), free(dy0), free(dx), free(dw), free(db);
    free(dw0), free(db0), free(ry), free(rdx), free(rdw), free(rdb);
}

static void test_maxpool(int n, int c, int h, int w, int k, int stride)
{
    struct mg_pool2d_dims d = {.n = n, .c = c, .h = h, .w = w, .k = k, .stride = stride};
    is_int(mg_pool2d_dims_finish(&d), 0, "pool dims");
    size_t nx = (size_t)n * c * h * w, ny = (size_t)n * c * d.oh * d.ow;
    float *x = randv(nx, 1), *y = randv(ny, 1), *dy = randv(ny, 1), *dx = randv(nx, 1);
    int32_t *idx = malloc(ny * sizeof(int32_t));
    double *ry = calloc(ny, 8), *rdx = calloc(nx, 8);
    /* plant ties: the first maximum must win */
    for (size_t i = 0; i + 1 < nx; i += 7)
        x[i + 1] = x[i];
    be->ops->maxpool2d_forward(be, &d, y, idx, x);
    int idx_ok = 1;
    for (int p = 0; p < n * c; p++)
        for (int i = 0; i < d.oh; i++)
            for (int j = 0; j < d.ow; j++) {
                double m = -INFINITY;
                int at = -1;
                for (int a = 0; a < k; a++)
                    for (int e = 0; e < k; e++) {
                        int off = (i * stride + a) * w + j * stride + e;
                        if (x[(size_t)p * h * w + off] > m) {
                            m = x[(size_t)p * h * w + off];
                            at = off;
                        }
                    }
                size_t o = (size_t)p * d.oh * d.ow + i * d.ow + j;
                ry[o] = m;
                idx_ok &= idx[o] == at;
                rdx[(size_t)p * h * w + at] += dy[o];
            }
    ok(maxdiff(y, ry, ny) == 0, "maxpool %dx%d k%d s%d forward", h, w, k, stride);
    ok(idx_ok, "maxpool k%d s%d: the first maximum wins ties", k, stride);
    be->ops->maxpool2d_backward(be, &d, dx, dy, idx);
    ok(maxdiff(dx, rdx, nx) < 1e-6, "maxpool k%d s%d backward", k, stride);
    free(x), free(y), free(dy), free(dx), free(idx), free(ry), free(rdx);
}

static void test_maxpool_nan(void)
{
    struct mg_pool2d_dims d = {.n = 1, .c = 1, .h = 2, .w = 4, .k = 2, .stride = 2};
    mg_pool2d_dims_finish(&d);
    float x[8] = {1, 5, 0, NAN, 7, 2, 9, 3}, y[2];
    int32_t idx[2];
    be->ops->maxpool2d_forward(be, &d, y, idx, x);
    ok(y[0] == 7 && idx[0] == 4, "maxpool picks the maximum");
    ok(isnan(y[1]) && idx[1] == 3, "maxpool propagates NaN like PyTorch");
}

static void test_relu_dropout(void)
{
    size_t n = 10000;
    float *x = randv(n, 1), *y = malloc(n * 4), *dy = randv(n, 1), *dx = malloc(n * 4);
    uint8_t *mask = malloc(n), *mask2 = malloc(n);
    be->ops->relu_forward(be, y, x, n);
    int good = 1;
    for (size_t i = 0; i < n; i++)
        good &= y[i] == (x[i] > 0 ? x[i] : 0);
    ok(good, "relu forward");
    be->ops->relu_backward(be, dx, dy, y, n);
    good = 1;
    for (size_t i = 0; i < n; i++)
        good &= dx[i] == (y[i] > 0 ? dy[i] : 0);
    ok(good, "relu backward");

    float p = 0.25f;
    be->ops->dropout_forward(be, y, mask, x, n, p, 7, 1000);
    size_t kept = 0;
    good = 1;
    for (size_t i = 0; i < n; i++) {
        kept += mask[i];
        good &= y[i] == (mask[i] ? x[i] * (1.0f / (1.0f - p)) : 0.0f);
    }
    ok(good, "dropout scales kept values by 1/(1-p) and zeroes the rest");
    ok(fabs((double)kept / n - 0.75) < 0.03, "dropout keeps about 1-p (%.3f)", (double)kept / n);
    be->ops->dropout_forward(be, y, mask2, x, n, p, 7, 1000);
    ok(!memcmp(mask, mask2, n), "dropout: same seed and offset, same mask");
    be->ops->dropout_forward(be, y, mask2, x, n, p, 7, 1000 + n);
    ok(memcmp(mask, mask2, n) != 0, "dropout: the next offset gives a new mask");
    be->ops->dropout_forward(be, y, mask2, x + 1, n - 1, p, 7, 1001);
    ok(!memcmp(mask + 1, mask2, n - 1), "dropout: element i uses number offset+i");
    be->ops->dropout_backward(be, dx, dy, mask, n, p);
    good = 1;
    for (size_t i = 0; i < n; i++)
        good &= dx[i] == (mask[i] ? dy[i] * (1.0f / (1.0f - p)) : 0.0f);
    ok(good, "dropout backward uses the forward mask");
    free(x), free(y), free(dy), free(dx), free(mask), free(mask2);
}

static void test_xent(void)
{
    int n = 6, C = 5;
    float *z = randv((size_t)n * C, 4), loss[6], probs[30], dz[30];
    int32_t labels[6] = {0, 4, 2, 2, 1, 3}, correct[6];
    z[5 * C + 1] = z[5 * C + 3] = 50; /* a tie between classes 1 and 3: 1 wins */
    be->ops->xent_forward(be, loss, correct, probs, z, labels, n, C);
    double rl[6], rp[30], rd[30];
    int corr_ok = 1;
    for (int i = 0; i < n; i++) {
        double m = -INFINITY, s = 0;
        int arg = 0;
        for (int c = 0; c < C; c++)
            if (z[i * C + c] > m) {
                m = z[i * C + c];
                arg = c;
            }
        for (int c = 0; c < C; c++)
            s += exp(z[i * C + c] - m);
        rl[i] = m + log(s) - z[i * C + labels[i]];
        for (int c = 0; c < C; c++) {
            rp[i * C + c] = exp(z[i * C + c] - m) / s;
            rd[i * C + c] = (rp[i * C + c] - (c == labels[i])) * 0.5;
        }
        corr_ok &= correct[i] == (arg == labels[i]);
    }
    ok(maxdiff(loss, rl, n) < 1e-6, "cross-entropy per sample: %.2g", maxdiff(loss, rl, n));
    ok(maxdiff(probs, rp, 30) < 1e-6, "softmax");
    ok(corr_ok && correct[5] == 0, "accuracy: argmax with the first max");
    be->ops->xent_backward(be, dz, probs, labels, n, C, 0.5f);
    ok(maxdiff(dz, rd, 30) < 1e-6, "cross-entropy backward");
    free(z);
}

static void test_optimizers(void)
{
    size_t n = 1000;
    float *p = randv(n, 1), *g = randv(n, 0.1f), *buf = calloc(n, 4), *m = calloc(n, 4),
          *v = calloc(n, 4);
    double *rp = malloc(n * 8), *rb = calloc(n, 8), *rm = calloc(n, 8), *rv = calloc(n, 8);
    for (size_t i = 0; i < n; i++)
        rp[i] = p[i];
    double lr = 0.05, mom = 0.9, wd = 1e-3;
    for (int s = 0; s < 3; s++) {
        be->ops->sgd_step(be, p, g, buf, n, lr, mom, wd, 1, s == 0);
        for (size_t i = 0; i < n; i++) {
            double d = g[i] + wd * rp[i];
            rb[i] = s == 0 ? d : rb[i] * mom + d;
            d = d + mom * rb[i];
            rp[i] -= lr * d;
        }
    }
    ok(maxdiff(p, rp, n) < 1e-6, "sgd nesterov + weight decay, 3 steps: %.2g", maxdiff(p, rp, n));
    for (size_t i = 0; i < n; i++)
        rp[i] = p[i];
    double b1 = 0.9, b2 = 0.999, eps = 1e-8;
    for (int s = 1; s <= 3; s++) {
        be->ops->adamw_step(be, p, g, m, v, n, 1e-3, b1, b2, eps, 0.01, (uint64_t)s);
        for (size_t i = 0; i < n; i++) {
            rp[i] *= 1 - 1e-3 * 0.01;
            rm[i] = rm[i] * b1 + (1 - b1) * g[i];
            rv[i] = rv[i] * b2 + (1 - b2) * g[i] * g[i];
            double denom = sqrt(rv[i]) / sqrt(1 - pow(b2, s)) + eps;
            rp[i] -= 1e-3 / (1 - pow(b1, s)) * rm[i] / denom;
        }
    }
    ok(maxdiff(p, rp, n) < 1e-6, "adamw, 3 steps: %.2g", maxdiff(p, rp, n));
    be->ops->scale(be, g, 0.5f, n);
    ok(1, "scale runs");
    free(p), free(g), free(buf), free(m), free(v), free(rp), free(rb), free(rm), free(rv);
}

static void test_normalize(void)
{
    uint8_t src[256];
    float dst[256];
    for (int i = 0; i < 256; i++)
        src[i] = (uint8_t)i;
    mg_k_normalize_u8(dst, src, 256, 0.2860f, 0.3530f);
    int good = 1;
    for (int i = 0; i < 256; i++) {
        volatile float a = (float)i / 255.0f;
        volatile float b = a - 0.2860f;
        good &= dst[i] == b / 0.3530f;
    }
    ok(good, "normalization is bit-exact ToTensor + Normalize");
}

/* The sparse products' kernel against the plain loop it vectorizes, bit for bit,
 * for lengths through every path (AVX-512 blocks of 64 where the CPU has it,
 * 8-wide blocks, the scalar tail): each output sums its terms in list order. */
static void test_gather_axpy(void)
{
    static const int lens[] = {5, 37, 64, 100, 800};
    int good = 1;
    for (size_t t = 0; t < sizeof(lens) / sizeof(lens[0]); t++) {
        int len = lens[t], rows = 9, n = 6;
        size_t stride = (size_t)len + 3;
        float *base = randv(stride * rows, 1.0f), *g = randv(n, 1.0f);
        float *out = randv(len, 1.0f), *want = malloc(sizeof(float) * len);
        int32_t idx[6] = {7, 0, 3, 3, 8, 1};
        for (int acc = 0; acc < 2; acc++) {
            for (int k = 0; k < len; k++) {
                volatile float a = acc ? out[k] : 0.0f;
                for (int j = 0; j < n; j++) {
                    volatile float prod = g[j] * base[(size_t)idx[j] * stride + k];
                    a = a + prod;
                }
                want[k] = a;
            }
            mg_k_gather_axpy(out, base, stride, idx, g, n, len, acc);
            good &= memcmp(out, want, sizeof(float) * len) == 0;
        }
        free(base), free(g), free(out), free(want);
    }
    ok(good, "gather_axpy: the same bits as the plain loop, every length and path");
}

int main(void)
{
    mg_mt19937_seed(&gen, 99);
    int rc = mg_backend_create(MG_DEVICE_CPU, NULL, &be);
    is_int(rc, 0, "CPU backend: %s", rc == 0 ? be->name : mg_strerror(rc));
    if (rc < 0)
        return done_testing();
    enum mg_device dev;
    is_int(mg_device_parse("cuda", &dev), 0, "cuda parses");
    struct mg_backend *cuda = NULL;
    if (!mg_device_available(MG_DEVICE_CUDA))
        is_int(mg_backend_create(MG_DEVICE_CUDA, NULL, &cuda), -MG_EUNSUPPORTED,
               "no CUDA backend in this build: -MG_EUNSUPPORTED");
    test_gather_axpy();
    test_linear(5, 7, 3, 0, 0);
    test_linear(64, 100, 33, 1, 0);
    test_linear(64, 100, 33, 1, 1);
    test_linear(16, 784, 256, 0, 1);
    for (int sparse = 0; sparse < 2; sparse++) {
        test_conv(3, 2, 9, 8, 4, 3, 1, 0, 0, sparse);
        test_conv(2, 3, 9, 9, 5, 3, 2, 1, 1, sparse);
        test_conv(2, 1, 7, 6, 3, 5, 1, 2, 1, sparse);
        test_conv(5, 4, 12, 12, 6, 5, 1, 0, 1, sparse);
        test_conv(4, 32, 12, 12, 64, 5, 1, 0, 1, sparse); /* the cnn's second conv */
        test_conv(3, 16, 36, 36, 4, 5, 1, 0, 1, sparse);  /* > 1 MB of im2col per sample */
    }
    test_maxpool(2, 3, 8, 8, 2, 2);
    test_maxpool(1, 2, 9, 7, 3, 2);
    test_maxpool(1, 2, 6, 6, 2, 1);
    test_maxpool_nan();
    test_relu_dropout();
    test_xent();
    test_optimizers();
    test_normalize();
    mg_backend_release(be);
    return done_testing();
}
