/* The GPU suite's backend part: every op of the CUDA backend against the CPU
 * backend (the reference), through alloc/upload/download only, forward and
 * backward, in every flag combination backend.h defines; and determinism:
 * each op, and a whole training step of both models, twice give the same
 * bits. Skips, saying why, without a usable GPU (docs/gpu.md).
 *
 * Where parity is promised (our kernels: bias, ReLU, dropout masks, max-pool
 * values and indices, the xent gradient, SGD, AdamW, scale, the bias
 * gradients' sums) the bits must be equal. Where cuBLAS and cuDNN decide the
 * summation order, each element must be within the worst-case bound of two
 * fp32 sums of K products, 2.2 K 2^-24 m (m: the same product of the inputs'
 * absolute values, computed by the CPU backend), plus 1e-5 of the largest m
 * for the transform-based convolution algorithms (FFT, Winograd), whose error
 * is norm-wise. Where the GPU's expf and logf decide (softmax), a relative
 * 4e-6 for the loss and 1e-6 + classes * 6e-8 for the probabilities.
 * timeout: 600 */
#include "backend.h"
#include "gpu_test.h"
#include "models.h"
#include "tap.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static struct mg_backend *cpu, *gpu;
static uint64_t rs = 0x2545f4914f6cdd1dULL;

static double urand(void)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (double)(rs >> 11) / 9007199254740992.0;
}

/* n floats in (-1, 1), a fraction `zeros` of them 0 */
static float *rnd(size_t n, double zeros)
{
    float *p = malloc((n ? n : 1) * sizeof(float));
    if (!p)
        BAIL_OUT("out of memory");
    for (size_t i = 0; i < n; i++)
        p[i] = urand() < zeros ? 0.0f : (float)(urand() * 2.0 - 1.0);
    return p;
}

static float *absf(const float *x, size_t n)
{
    float *p = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++)
        p[i] = fabsf(x[i]);
    return p;
}

static void *dup_host(const void *p, size_t bytes)
{
    void *q = malloc(bytes ? bytes : 1);
    if (!q)
        BAIL_OUT("out of memory");
    memcpy(q, p, bytes);
    return q;
}

/* device copy of host memory */
static void *up(const void *host, size_t bytes)
{
    void *d = gpu->ops->alloc(gpu, bytes);
    if (!d)
        BAIL_OUT("cuda alloc of %zu bytes: %s", bytes, mg_backend_errmsg(gpu));
    if (host)
        gpu->ops->upload(gpu, d, host, bytes);
    return d;
}

/* host copy of device memory */
static void *down(const void *dev, size_t bytes)
{
    void *h = malloc(bytes ? bytes : 1);
    if (!h)
        BAIL_OUT("out of memory");
    gpu->ops->download(gpu, h, dev, bytes);
    return h;
}

static int synced(const char *what)
{
    int rc = gpu->ops->sync(gpu);
    if (rc)
        diag("%s: %s", what, mg_backend_errmsg(gpu));
    return rc == 0;
}

/* The worst |got - want| / tolerance over n elements (<= 1 passes): tolerance
 * 2.2 K 2^-24 m[i] + 1e-5 max(m). */
static double worst(const float *got, const float *want, const float *m, size_t n, double K)
{
    double mmax = 0, w = 0;
    for (size_t i = 0; i < n; i++)
        mmax = fmax(mmax, m[i]);
    for (size_t i = 0; i < n; i++) {
        if (isnan(got[i]) != isnan(want[i]))
            return INFINITY;
        double tol = 2.2 * K * ldexp(1.0, -24) * m[i] + 1e-5 * mmax + 1e-30;
        w = fmax(w, fabs((double)got[i] - want[i]) / tol);
    }
    return w;
}

static int same(const void *a, const void *b, size_t bytes)
{
    return memcmp(a, b, bytes) == 0;
}

/* ---- memory --------------------------------------------------------------------------- */

static void test_memory(void)
{
    size_t n = 4099;
    float *h = rnd(n, 0.1);
    float *d = up(NULL, n * 4);
    float *z = down(d, n * 4);
    int zeros = 1;
    for (size_t i = 0; i < n; i++)
        zeros &= z[i] == 0.0f;
    ok(zeros && synced("alloc"), "alloc gives zero-filled memory");
    gpu->ops->upload(gpu, d, h, n * 4);
    float *back = down(d, n * 4);
    ok(synced("upload") && same(h, back, n * 4), "upload then download: the same bytes");

    /* copy with memmove's contract, overlapping both ways */
    float *want = dup_host(h, n * 4);
    memmove(want + 100, want, 3000 * 4);
    memmove(want + 3500, want + 3600, 400 * 4);
    memmove(want + 1, want + 2, 500 * 4);
    gpu->ops->copy(gpu, d + 100, d, 3000 * 4);
    gpu->ops->copy(gpu, d + 3500, d + 3600, 400 * 4);
    gpu->ops->copy(gpu, d + 1, d + 2, 500 * 4);
    free(back);
    back = down(d, n * 4);
    ok(synced("copy") && same(want, back, n * 4), "copy: overlapping ranges as memmove does");
    gpu->ops->zero(gpu, d + 7, 13 * 4);
    memset(want + 7, 0, 13 * 4);
    free(back);
    back = down(d, n * 4);
    ok(synced("zero") && same(want, back, n * 4), "zero clears exactly its range");
    void *empty = gpu->ops->alloc(gpu, 0);
    ok(empty != NULL, "alloc(0) gives a pointer");
    gpu->ops->free(gpu, empty);
    gpu->ops->free(gpu, d);
    ok(synced("free"), "free");
    free(h);
    free(z);
    free(want);
    free(back);
}

/* ---- linear --------------------------------------------------------------------------- */

static void test_linear(int n, int in, int out, int bias, int relu)
{
    size_t nx = (size_t)n * in, nw = (size_t)in * out, ny = (size_t)n * out;
    float *x = rnd(nx, 0.2), *w = rnd(nw, 0), *b = rnd(out, 0);
    float *yc = malloc(ny * 4), *m = malloc(ny * 4);
    float *ax = absf(x, nx), *aw = absf(w, nw), *ab = absf(b, out);
    cpu->ops->linear_forward(cpu, yc, x, w, bias ? b : NULL, n, in, out, relu);
    cpu->ops->linear_forward(cpu, m, ax, aw, bias ? ab : NULL, n, in, out, 0);
    float *dx_ = up(x, nx * 4), *dw_ = up(w, nw * 4), *db_ = up(b, out * 4),
          *dy_ = up(NULL, ny * 4);
    gpu->ops->linear_forward(gpu, dy_, dx_, dw_, bias ? db_ : NULL, n, in, out, relu);
    float *yg = down(dy_, ny * 4);
    double e = worst(yg, yc, m, ny, in + 1);
    ok(synced("linear_forward") && e <= 1,
       "linear forward %dx%d -> %d, bias %d relu %d: within %.2f of the tolerance", n, in, out,
       bias, relu, e);
    gpu->ops->linear_forward(gpu, dy_, dx_, dw_, bias ? db_ : NULL, n, in, out, relu);
    float *yg2 = down(dy_, ny * 4);
    ok(synced("linear_forward") && same(yg, yg2, ny * 4), "... twice: the same bits");

    /* backward, with a dy that a ReLU left sparse, every accumulate / dx combination */
    float *g = rnd(ny, 0.6), *ag = absf(g, ny);
    size_t scratch_bytes = cpu->ops->linear_scratch(cpu, n, in, out);
    void *scratch = malloc(scratch_bytes ? scratch_bytes : 1);
    size_t gscratch_bytes = gpu->ops->linear_scratch(gpu, n, in, out);
    void *gscratch = gscratch_bytes ? up(NULL, gscratch_bytes) : NULL;
    float *dg = up(g, ny * 4);
    for (int acc = 0; acc < 2; acc++)
        for (int want_dx = 0; want_dx < 2; want_dx++) {
            float *dw0 = rnd(nw, 0), *db0 = rnd(out, 0);
            float *cdx = malloc(nx * 4), *cdw = dup_host(dw0, nw * 4),
                  *cdb = dup_host(db0, out * 4);
            float *mdx = malloc(nx * 4), *mdw = absf(dw0, nw), *mdb = absf(db0, out);
            cpu->ops->linear_backward(cpu, want_dx ? cdx : NULL, cdw, cdb, g, x, w, n, in, out, acc,
                                      scratch);
            cpu->ops->linear_backward(cpu, mdx, mdw, mdb, ag, ax, aw, n, in, out, acc, NULL);
            float *gdx = up(NULL, nx * 4), *gdw = up(dw0, nw * 4), *gdb = up(db0, out * 4);
            gpu->ops->linear_backward(gpu, want_dx ? gdx : NULL, gdw, gdb, dg, dx_, dw_, n, in, out,
                                      acc, gscratch);
            float *hdx = down(gdx, nx * 4), *hdw = down(gdw, nw * 4), *hdb = down(gdb, out * 4);
            int good = synced("linear_backward");
            double edw = worst(hdw, cdw, mdw, nw, n + 1);
            double edx = want_dx ? worst(hdx, cdx, mdx, nx, out) : 0;
            ok(good && same(hdb, cdb, out * 4) && edw <= 1 && edx <= 1,
               "linear backward %dx%d -> %d accumulate %d dx %d: db same bits, dw within %.2f, "
               "dx within %.2f of the tolerance",
               n, in, out, acc, want_dx, edw, edx);
            if (!want_dx) {
                int zeros = 1;
                for (size_t i = 0; i < nx; i++)
                    zeros &= hdx[i] == 0.0f;
                ok(zeros, "... dx == NULL leaves dx alone");
            }
            gpu->ops->free(gpu, gdx);
            gpu->ops->free(gpu, gdw);
            gpu->ops->free(gpu, gdb);
            free(dw0);
            free(db0);
            free(cdx);
            free(cdw);
            free(cdb);
            free(mdx);
            free(mdw);
            free(mdb);
            free(hdx);
            free(hdw);
            free(hdb);
        }
    gpu->ops->free(gpu, dx_);
    gpu->ops->free(gpu, dw_);
    gpu->ops->free(gpu, db_);
    gpu->ops->free(gpu, dy_);
    gpu->ops->free(gpu, dg);
    if (gscratch)
        gpu->ops->free(gpu, gscratch);
    free(scratch);
    free(x);
    free(w);
    free(b);
    free(yc);
    free(m);
    free(ax);
    free(aw);
    free(ab);
    free(yg);
    free(yg2);
    free(g);
    free(ag);
}

/* ---- convolution ------------------------------------------------------------------------ */

static void test_conv(int n, int c, int h, int w, int oc, int k, int stride, int pad, int relu,
                      int sparse)
{
    struct mg_conv2d_dims d = {
        .n = n, .c = c, .h = h, .w = w, .oc = oc, .kh = k, .kw = k, .stride = stride, .pad = pad};
    if (mg_conv2d_dims_finish(&d) < 0)
        BAIL_OUT("bad conv case");
    size_t nx = (size_t)n * c * h * w, nw = (size_t)oc * c * k * k;
    size_t ny = (size_t)n * oc * d.oh * d.ow;
    int P = d.oh * d.ow, K = c * k * k;
    size_t cs = cpu->ops->conv2d_scratch(cpu, &d), gs = gpu->ops->conv2d_scratch(gpu, &d);
    void *cscr = malloc(cs ? cs : 1), *gscr = up(NULL, gs ? gs : 256);
    float *x = rnd(nx, 0.1), *wt = rnd(nw, 0), *b = rnd(oc, 0);
    float *ax = absf(x, nx), *aw = absf(wt, nw), *ab = absf(b, oc);
    float *yc = malloc(ny * 4), *m = malloc(ny * 4);
    cpu->ops->conv2d_forward(cpu, &d, yc, x, wt, b, relu, cscr);
    cpu->ops->conv2d_forward(cpu, &d, m, ax, aw, ab, 0, cscr);
    float *gx = up(x, nx * 4), *gw = up(wt, nw * 4), *gb = up(b, oc * 4), *gy = up(NULL, ny * 4);
    gpu->ops->conv2d_forward(gpu, &d, gy, gx, gw, gb, relu, gscr);
    float *yg = down(gy, ny * 4);
    double e = worst(yg, yc, m, ny, K + 1);
    ok(synced("conv2d_forward") && e <= 1,
       "conv forward %dx%dx%dx%d * %dx%dx%d stride %d pad %d relu %d: within %.2f of the "
       "tolerance",
       n, c, h, w, oc, k, k, stride, pad, relu, e);
    gpu->ops->conv2d_forward(gpu, &d, gy, gx, gw, gb, relu, gscr);
    float *yg2 = down(gy, ny * 4);
    ok(synced("conv2d_forward") && same(yg, yg2, ny * 4), "... twice: the same bits");

    /* backward from the CPU's y, so that both mask dy the same way */
    float *gyc = up(yc, ny * 4);
    for (int acc = 0; acc < 2; acc++)
        for (int want_dx = 0; want_dx < 2; want_dx++) {
            float *dy = rnd(ny, 0.5), *dw0 = rnd(nw, 0), *db0 = rnd(oc, 0);
            float *cdy = dup_host(dy, ny * 4), *cdx = malloc(nx * 4);
            float *cdw = dup_host(dw0, nw * 4), *cdb = dup_host(db0, oc * 4);
            cpu->ops->conv2d_backward(cpu, &d, want_dx ? cdx : NULL, cdw, cdb, cdy, x, wt, yc, relu,
                                      acc, sparse, cscr);
            /* magnitudes: the same sums over the masked dy's absolute values */
            float *ady = absf(cdy, ny), *mdx = malloc(nx * 4), *mdw = absf(dw0, nw);
            float *mdb = absf(db0, oc);
            cpu->ops->conv2d_backward(cpu, &d, mdx, mdw, mdb, ady, ax, aw, NULL, 0, acc, 0, cscr);
            float *gdy = up(dy, ny * 4), *gdx = up(NULL, nx * 4), *gdw = up(dw0, nw * 4);
            float *gdb = up(db0, oc * 4);
            gpu->ops->conv2d_backward(gpu, &d, want_dx ? gdx : NULL, gdw, gdb, gdy, gx, gw, gyc,
                                      relu, acc, sparse, gscr);
            float *hdy = down(gdy, ny * 4), *hdx = down(gdx, nx * 4), *hdw = down(gdw, nw * 4);
            float *hdb = down(gdb, oc * 4);
            int good = synced("conv2d_backward");
            /* the CPU's dense path sums the bias gradient as ours does; its sparse one not */
            int cpu_dense = !sparse || K < 64;
            double edb = cpu_dense ? (same(hdb, cdb, oc * 4) ? 0 : INFINITY)
                                   : worst(hdb, cdb, mdb, oc, (double)n * P + 1);
            double edw = worst(hdw, cdw, mdw, nw, (double)n * P + 1);
            double edx = want_dx ? worst(hdx, cdx, mdx, nx, (double)oc * k * k) : 0;
            ok(good && same(hdy, cdy, ny * 4) && edb <= 1 && edw <= 1 && edx <= 1,
               "conv backward %dx%dx%dx%d * %dx%dx%d relu %d accumulate %d dx %d sparse %d: "
               "dy masked the same, db %s, dw within %.2f, dx within %.2f",
               n, c, h, w, oc, k, k, relu, acc, want_dx, sparse,
               cpu_dense ? (edb == 0 ? "same bits" : "DIFFERENT BITS") : "within tolerance", edw,
               edx);
            if (acc == 1 && want_dx == 1) {
                /* determinism of the backward: the same inputs again */
                gpu->ops->upload(gpu, gdy, dy, ny * 4);
                gpu->ops->upload(gpu, gdw, dw0, nw * 4);
                gpu->ops->upload(gpu, gdb, db0, oc * 4);
                gpu->ops->conv2d_backward(gpu, &d, gdx, gdw, gdb, gdy, gx, gw, gyc, relu, acc,
                                          sparse, gscr);
                float *hdx2 = down(gdx, nx * 4), *hdw2 = down(gdw, nw * 4);
                float *hdb2 = down(gdb, oc * 4);
                ok(synced("conv2d_backward") && same(hdx, hdx2, nx * 4) &&
                       same(hdw, hdw2, nw * 4) && same(hdb, hdb2, oc * 4),
                   "... backward twice: the same bits");
                free(hdx2);
                free(hdw2);
                free(hdb2);
            }
            gpu->ops->free(gpu, gdy);
            gpu->ops->free(gpu, gdx);
            gpu->ops->free(gpu, gdw);
            gpu->ops->free(gpu, gdb);
            free(dy);
            free(dw0);
            free(db0);
            free(cdy);
            free(cdx);
            free(cdw);
            free(cdb);
            free(ady);
            free(mdx);
            free(mdw);
            free(mdb);
            free(hdy);
            free(hdx);
            free(hdw);
            free(hdb);
        }
    gpu->ops->free(gpu, gx);
    gpu->ops->free(gpu, gw);
    gpu->ops->free(gpu, gb);
    gpu->ops->free(gpu, gy);
    gpu->ops->free(gpu, gyc);
    gpu->ops->free(gpu, gscr);
    free(cscr);
    free(x);
    free(wt);
    free(b);
    free(ax);
    free(aw);
    free(ab);
    free(yc);
    free(m);
    free(yg);
    free(yg2);
}

/* ---- exact ops ---------------------------------------------------------------------------- */

static void test_pool(int planes, int h, int w, int k, int stride)
{
    struct mg_pool2d_dims d = {.n = 1, .c = planes, .h = h, .w = w, .k = k, .stride = stride};
    if (mg_pool2d_dims_finish(&d) < 0)
        BAIL_OUT("bad pool case");
    size_t in = (size_t)planes * h * w, out = (size_t)planes * d.oh * d.ow;
    float *x = rnd(in, 0.3), *dy = rnd(out, 0);
    float *yc = malloc(out * 4), *dxc = malloc(in * 4);
    int32_t *ic = malloc(out * 4);
    cpu->ops->maxpool2d_forward(cpu, &d, yc, ic, x);
    cpu->ops->maxpool2d_backward(cpu, &d, dxc, dy, ic);
    float *gx = up(x, in * 4), *gy = up(NULL, out * 4), *gdy = up(dy, out * 4);
    float *gdx = up(NULL, in * 4);
    int32_t *gi = up(NULL, out * 4);
    gpu->ops->maxpool2d_forward(gpu, &d, gy, gi, gx);
    gpu->ops->maxpool2d_backward(gpu, &d, gdx, gdy, gi);
    float *yg = down(gy, out * 4), *dxg = down(gdx, in * 4);
    int32_t *ig = down(gi, out * 4);
    ok(synced("maxpool") && same(yc, yg, out * 4) && same(ic, ig, out * 4) &&
           same(dxc, dxg, in * 4),
       "max-pool %dx%dx%d k=%d stride %d: same values, indices and dx bits", planes, h, w, k,
       stride);
    gpu->ops->free(gpu, gx);
    gpu->ops->free(gpu, gy);
    gpu->ops->free(gpu, gdy);
    gpu->ops->free(gpu, gdx);
    gpu->ops->free(gpu, gi);
    free(x);
    free(dy);
    free(yc);
    free(dxc);
    free(ic);
    free(yg);
    free(dxg);
    free(ig);
}

static void test_elementwise(size_t n)
{
    float *x = rnd(n, 0.2), *dy = rnd(n, 0);
    float *yc = malloc(n * 4), *dxc = malloc(n * 4);
    uint8_t *mc = malloc(n);
    float *gx = up(x, n * 4), *gdy = up(dy, n * 4), *gy = up(NULL, n * 4), *gdx = up(NULL, n * 4);
    uint8_t *gm = up(NULL, n);

    cpu->ops->relu_forward(cpu, yc, x, n);
    cpu->ops->relu_backward(cpu, dxc, dy, yc, n);
    gpu->ops->relu_forward(gpu, gy, gx, n);
    gpu->ops->relu_backward(gpu, gdx, gdy, gy, n);
    float *yg = down(gy, n * 4), *dxg = down(gdx, n * 4);
    ok(synced("relu") && same(yc, yg, n * 4) && same(dxc, dxg, n * 4),
       "relu forward and backward, n=%zu: same bits", n);
    free(yg);
    free(dxg);

    static const float ps[] = {0.0f, 0.25f, 0.5f, 1.0f};
    for (int i = 0; i < 4; i++) {
        cpu->ops->dropout_forward(cpu, yc, mc, x, n, ps[i], 77, (uint64_t)i << 33);
        cpu->ops->dropout_backward(cpu, dxc, dy, mc, n, ps[i]);
        gpu->ops->dropout_forward(gpu, gy, gm, gx, n, ps[i], 77, (uint64_t)i << 33);
        gpu->ops->dropout_backward(gpu, gdx, gdy, gm, n, ps[i]);
        yg = down(gy, n * 4);
        dxg = down(gdx, n * 4);
        uint8_t *mg = down(gm, n);
        ok(synced("dropout") && same(yc, yg, n * 4) && same(mc, mg, n) && same(dxc, dxg, n * 4),
           "dropout p=%g n=%zu: the same mask (counter RNG) and bits", (double)ps[i], n);
        free(yg);
        free(dxg);
        free(mg);
    }

    memcpy(yc, x, n * 4);
    cpu->ops->scale(cpu, yc, 0.125f + 1e-3f, n);
    gpu->ops->scale(gpu, gx, 0.125f + 1e-3f, n);
    yg = down(gx, n * 4);
    ok(synced("scale") && same(yc, yg, n * 4), "scale n=%zu: same bits", n);
    free(yg);

    gpu->ops->free(gpu, gx);
    gpu->ops->free(gpu, gdy);
    gpu->ops->free(gpu, gy);
    gpu->ops->free(gpu, gdx);
    gpu->ops->free(gpu, gm);
    free(x);
    free(dy);
    free(yc);
    free(dxc);
    free(mc);
}

static void test_xent(int n, int classes)
{
    size_t t = (size_t)n * classes;
    float *z = rnd(t, 0);
    int32_t *lab = malloc(n * 4), *cc = malloc(n * 4);
    for (int i = 0; i < n; i++) {
        lab[i] = (int32_t)(urand() * classes);
        for (int k = 0; k < classes; k++)
            z[(size_t)i * classes + k] *= 6.0f;
    }
    if (n > 1 && classes > 2)
        z[classes + 1] = z[classes + 2] = 9.0f; /* a tie: the first maximum wins */
    float *lc = malloc(n * 4), *pc = malloc(t * 4), *dc = malloc(t * 4);
    cpu->ops->xent_forward(cpu, lc, cc, pc, z, lab, n, classes);
    cpu->ops->xent_backward(cpu, dc, pc, lab, n, classes, 1.0f / n);
    float *gz = up(z, t * 4), *gl = up(NULL, n * 4), *gp = up(NULL, t * 4), *gd = up(NULL, t * 4);
    int32_t *glab = up(lab, n * 4), *gc = up(NULL, n * 4);
    gpu->ops->xent_forward(gpu, gl, gc, gp, gz, glab, n, classes);
    float *lg = down(gl, n * 4), *pg = down(gp, t * 4);
    int32_t *cg = down(gc, n * 4);
    double dl = 0, dp = 0;
    for (int i = 0; i < n; i++) {
        dl = fmax(dl, fabs((double)lg[i] - lc[i]) / (1.0 + fabs((double)lc[i])));
        for (int k = 0; k < classes; k++) {
            double a = pc[(size_t)i * classes + k], b = pg[(size_t)i * classes + k];
            dp = fmax(dp, a == b ? 0 : fabs(a - b) / (fabs(a) + 1e-37));
        }
    }
    double ptol = 1e-6 + classes * 6e-8;
    ok(synced("xent_forward") && same(cc, cg, n * 4) && dl <= 4e-6 && dp <= ptol,
       "xent forward n=%d classes=%d: same correct[]; loss within %.1e (<= 4e-6), probabilities "
       "within %.1e (<= %.1e)",
       n, classes, dl, dp, ptol);
    /* the backward from the CPU's probabilities: exact */
    gpu->ops->upload(gpu, gp, pc, t * 4);
    gpu->ops->xent_backward(gpu, gd, gp, glab, n, classes, 1.0f / n);
    float *dg = down(gd, t * 4);
    ok(synced("xent_backward") && same(dc, dg, t * 4), "xent backward n=%d classes=%d: same bits",
       n, classes);
    gpu->ops->free(gpu, gz);
    gpu->ops->free(gpu, gl);
    gpu->ops->free(gpu, gp);
    gpu->ops->free(gpu, gd);
    gpu->ops->free(gpu, glab);
    gpu->ops->free(gpu, gc);
    free(z);
    free(lab);
    free(cc);
    free(lc);
    free(pc);
    free(dc);
    free(lg);
    free(pg);
    free(cg);
    free(dg);
}

static void test_optim(size_t n)
{
    for (int wd = 0; wd < 2; wd++)
        for (int mom = 0; mom < 2; mom++)
            for (int nest = 0; nest <= mom; nest++) {
                float *p = rnd(n, 0), *buf = rnd(n, 0);
                float *gp = up(p, n * 4), *gb = up(buf, n * 4);
                int good = 1;
                for (int step = 0; step < 4; step++) {
                    float *g = rnd(n, 0.1);
                    float *gg = up(g, n * 4);
                    cpu->ops->sgd_step(cpu, p, g, buf, n, 0.05, mom ? 0.9 : 0, wd ? 1e-2 : 0, nest,
                                       step == 0);
                    gpu->ops->sgd_step(gpu, gp, gg, gb, n, 0.05, mom ? 0.9 : 0, wd ? 1e-2 : 0, nest,
                                       step == 0);
                    good &= synced("sgd_step");
                    gpu->ops->free(gpu, gg);
                    free(g);
                }
                float *hp = down(gp, n * 4), *hb = down(gb, n * 4);
                ok(good && same(p, hp, n * 4) && (!mom || same(buf, hb, n * 4)),
                   "sgd weight_decay %d momentum %d nesterov %d, 4 steps, n=%zu: same bits", wd,
                   mom, nest, n);
                gpu->ops->free(gpu, gp);
                gpu->ops->free(gpu, gb);
                free(p);
                free(buf);
                free(hp);
                free(hb);
            }
    for (int wd = 0; wd < 2; wd++) {
        float *p = rnd(n, 0), *m = calloc(n, 4), *v = calloc(n, 4);
        float *gp = up(p, n * 4), *gm = up(NULL, n * 4), *gv = up(NULL, n * 4);
        int good = 1;
        for (uint64_t step = 1; step <= 5; step++) {
            float *g = rnd(n, 0.1);
            float *gg = up(g, n * 4);
            cpu->ops->adamw_step(cpu, p, g, m, v, n, 1e-3, 0.9, 0.999, 1e-8, wd ? 0.01 : 0, step);
            gpu->ops->adamw_step(gpu, gp, gg, gm, gv, n, 1e-3, 0.9, 0.999, 1e-8, wd ? 0.01 : 0,
                                 step);
            good &= synced("adamw_step");
            gpu->ops->free(gpu, gg);
            free(g);
        }
        float *hp = down(gp, n * 4), *hm = down(gm, n * 4), *hv = down(gv, n * 4);
        ok(good && same(p, hp, n * 4) && same(m, hm, n * 4) && same(v, hv, n * 4),
           "adamw weight_decay %d, 5 steps, n=%zu: same bits (p, m, v)", wd, n);
        gpu->ops->free(gpu, gp);
        gpu->ops->free(gpu, gm);
        gpu->ops->free(gpu, gv);
        free(p);
        free(m);
        free(v);
        free(hp);
        free(hm);
        free(hv);
    }
}

/* ---- overlap, errors ----------------------------------------------------------------------- */

static void test_overlap(void)
{
    size_t n = 1 << 20;
    float *pinned = mg_backend_host_alloc(gpu, n * 4);
    float *d = up(NULL, n * 4), *y = up(NULL, n * 4);
    ok(pinned != NULL, "host_alloc gives page-locked memory");
    if (!pinned)
        return;
    for (size_t i = 0; i < n; i++)
        pinned[i] = (float)((int)(i % 1001) - 500);
    uint64_t t = mg_backend_upload_async(gpu, d, pinned, n * 4);
    ok(t > 0, "upload_async queues the copy (ticket %llu)", (unsigned long long)t);
    mg_backend_upload_wait(gpu, t);
    gpu->ops->relu_forward(gpu, y, d, n);
    float *h = down(y, n * 4);
    int good = 1;
    for (size_t i = 0; i < n; i++)
        good &= h[i] == (pinned[i] > 0 ? pinned[i] : 0.0f);
    ok(synced("upload_async") && good, "an op queued after upload_wait sees the uploaded data");
    ok(mg_backend_upload_done(gpu, t, 1) == 1, "upload_done(wait) says the copy finished");
    void *ev = mg_backend_event_record(gpu);
    ok(ev != NULL, "event_record gives an event for the communicator");
    mg_backend_event_release(gpu, ev);
    ok(synced("events"), "events cost no error");
    mg_backend_host_free(gpu, pinned);
    gpu->ops->free(gpu, d);
    gpu->ops->free(gpu, y);
    free(h);
}

/* compute -> copy: a copy queued after upload_after(event) lands after the compute before
 * the event, so it is what stays (without the wait the two race); and the loss
 * accumulator: the CPU's doubles, bit for bit, a NaN step kept. */
static void test_sync_free(void)
{
    size_t n = 1 << 22;
    float *pinned = mg_backend_host_alloc(gpu, n * 4);
    float *x = up(NULL, n * 4), *y = up(NULL, n * 4);
    if (!pinned)
        BAIL_OUT("no page-locked memory");
    for (size_t i = 0; i < n; i++)
        pinned[i] = -1.0f - (float)(i % 7);
    gpu->ops->scale(gpu, x, 0.0f, n);
    for (int k = 0; k < 8; k++) /* long enough that an unordered copy would land first */
        gpu->ops->relu_forward(gpu, y, x, n);
    void *ev = mg_backend_event_record(gpu);
    mg_backend_upload_after(gpu, ev);
    mg_backend_event_release(gpu, ev);
    uint64_t t = mg_backend_upload_async(gpu, y, pinned, n * 4);
    mg_backend_upload_wait(gpu, t);
    float *h = down(y, n * 4);
    ok(synced("upload_after") && same(h, pinned, n * 4),
       "upload_after: the copy lands after the compute recorded before the event");
    free(h);

    double want[MG_ACC_LEN] = {0}, *acc = up(NULL, sizeof(want)), got[MG_ACC_LEN];
    double *cacc = cpu->ops->alloc(cpu, sizeof(want));
    for (int k = 0; k < 6; k++) {
        int m = 1 + 53 * k % 97;
        float *r = rnd((size_t)m, 0.1), *loss = absf(r, (size_t)m);
        free(r);
        int32_t *c = malloc((size_t)m * 4);
        for (int i = 0; i < m; i++)
            c[i] = urand() < 0.5;
        if (k == 3)
            loss[0] = NAN;
        float *dl = up(loss, (size_t)m * 4);
        int32_t *dc = up(c, (size_t)m * 4);
        cpu->ops->loss_accumulate(cpu, cacc, loss, c, m, k % 2, k / 2 + 1);
        gpu->ops->loss_accumulate(gpu, acc, dl, dc, m, k % 2, k / 2 + 1);
        gpu->ops->free(gpu, dl);
        gpu->ops->free(gpu, dc);
        free(loss);
        free(c);
    }
    memcpy(want, cacc, sizeof(want));
    gpu->ops->download(gpu, got, acc, sizeof(got));
    ok(synced("loss_accumulate") && same(want, got, sizeof(got)) && want[MG_ACC_BAD_STEP] == 2.0,
       "loss_accumulate: the CPU's sums and counts, bit for bit, the NaN step kept (%g)",
       got[MG_ACC_BAD_STEP]);
    cpu->ops->free(cpu, cacc);

    /* poll: an error already seen is returned without waiting, and kept for sync() */
    gpu->ops->linear_forward(gpu, y, x, x, NULL, -1, 4, 4, 0);
    ok(mg_backend_poll(gpu) < 0, "poll() returns an error already seen, without a sync");
    ok(gpu->ops->sync(gpu) < 0 && gpu->ops->sync(gpu) == 0, "... and sync() still reports it");
    mg_backend_host_free(gpu, pinned);
    gpu->ops->free(gpu, x);
    gpu->ops->free(gpu, y);
    gpu->ops->free(gpu, acc);
}

static void test_errors(void)
{
    float *y = up(NULL, 64), *x = up(NULL, 64);
    /* cuBLAS refuses a negative size before touching the GPU: a clean, local error */
    gpu->ops->linear_forward(gpu, y, x, x, NULL, -1, 4, 4, 0);
    int rc = gpu->ops->sync(gpu);
    const char *msg = mg_backend_errmsg(gpu);
    ok(rc < 0, "sync() returns the error of an op queued before it (%s)", mg_strerror(rc));
    ok(strstr(msg, "cublasSgemm") && strstr(msg, "CUBLAS_STATUS_INVALID_VALUE") &&
           strstr(msg, "cuda_backend.c:"),
       "the message names the call, the file and line, and cuBLAS's words: %s", msg);
    is_int(gpu->ops->sync(gpu), 0, "the next sync() has nothing to report");
    gpu->ops->relu_forward(gpu, y, x, 16);
    ok(synced("relu after an error"), "the backend still works");
    gpu->ops->free(gpu, y);
    gpu->ops->free(gpu, x);
    gpu->ops->relu_forward(gpu, NULL, NULL, 0);
    gpu->ops->scale(gpu, NULL, 2.0f, 0);
    ok(synced("empty ops"), "ops on zero elements do nothing, and fail nothing");
}

/* ---- a whole training step ---------------------------------------------------------------- */

static int queued_differs; /* steps whose queued loss sums differ from mg_model_loss's */

static uint64_t model_step(struct mg_backend *be, const char *name, int batch, float *params_out,
                           double *loss)
{
    struct mg_model m;
    char err[MG_ERRMSG_LEN];
    if (mg_model_create(&m, be, name, NULL, batch, err) < 0)
        BAIL_OUT("%s on %s: %s", name, be->name, err);
    mg_model_init_params(&m, 1234);
    size_t in = (size_t)batch * MG_MODEL_INPUT_H * MG_MODEL_INPUT_W;
    uint64_t keep = rs;
    rs = 42;
    float *x = rnd(in, 0.5);
    int32_t *lab = malloc(batch * 4);
    for (int i = 0; i < batch; i++)
        lab[i] = (int32_t)(urand() * MG_MODEL_CLASSES);
    rs = keep;
    be->ops->upload(be, m.input, x, in * 4);
    be->ops->upload(be, m.labels, lab, batch * 4);
    long correct;
    float *buf = be->ops->alloc(be, m.nparams * 4);
    double *acc = be->ops->alloc(be, MG_ACC_LEN * sizeof(double)), host[MG_ACC_LEN];
    for (int step = 0; step < 3; step++) {
        mg_model_forward(&m, batch, 1);
        /* the step loop's way (on the device) and the synchronous one: the same bits */
        mg_model_loss_queue(&m, batch, acc, 1, step + 1);
        be->ops->download(be, host, acc, sizeof(host));
        be->ops->zero(be, acc, sizeof(host));
        if (mg_model_loss(&m, batch, loss, &correct) < 0 ||
            mg_model_backward(&m, batch, 1.0f / batch, 0, NULL, NULL) < 0)
            BAIL_OUT("%s step on %s failed: %s", name, be->name, mg_backend_errmsg(be));
        if (!same(&host[MG_ACC_TOTAL], loss, sizeof(*loss)) ||
            host[MG_ACC_CORRECT] != (double)correct)
            queued_differs++;
        be->ops->sgd_step(be, m.param_buf, m.grad_buf, buf, m.nparams, 0.05, 0.9, 1e-4, 0,
                          step == 0);
    }
    if (be->ops->sync(be) < 0)
        BAIL_OUT("%s on %s: %s", name, be->name, mg_backend_errmsg(be));
    be->ops->free(be, acc);
    uint64_t hash = mg_model_param_hash(&m);
    if (params_out)
        mg_model_get_params(&m, params_out);
    be->ops->free(be, buf);
    mg_model_release(&m);
    free(x);
    free(lab);
    return hash;
}

static void test_model(const char *name)
{
    struct mg_model probe;
    char err[MG_ERRMSG_LEN];
    if (mg_model_create(&probe, cpu, name, NULL, 8, err) < 0)
        BAIL_OUT("%s", err);
    size_t np = probe.nparams;
    mg_model_release(&probe);
    float *pc = malloc(np * 4), *pg = malloc(np * 4);
    double lc, lg, lg2;
    model_step(cpu, name, 64, pc, &lc);
    uint64_t h1 = model_step(gpu, name, 64, pg, &lg);
    uint64_t h2 = model_step(gpu, name, 64, NULL, &lg2);
    ok(h1 == h2 && lg == lg2,
       "%s: three training steps on the GPU, twice: the same parameter bits (hash %016llx)", name,
       (unsigned long long)h1);
    double dmax = 0, pmax = 0;
    for (size_t i = 0; i < np; i++) {
        dmax = fmax(dmax, fabs((double)pc[i] - pg[i]));
        pmax = fmax(pmax, fabs((double)pc[i]));
    }
    ok(fabs(lg - lc) <= 1e-4 * (1 + fabs(lc)) && dmax <= 1e-4 * pmax,
       "%s: the GPU's steps follow the CPU's: loss %.6f vs %.6f, parameters within %.2e (of "
       "%.2e)",
       name, lg / 64, lc / 64, dmax, pmax);
    is_int(queued_differs, 0,
           "%s: the loss and correct count summed on the device are the synchronous path's bits",
           name);
    free(pc);
    free(pg);
}

int main(void)
{
    char err[MG_ERRMSG_LEN];
    gpu_test_device_or_skip(0);
    if (mg_backend_create(MG_DEVICE_CPU, NULL, &cpu) < 0)
        BAIL_OUT("no CPU backend");
    struct mg_backend_opts o = {.device_index = 0};
    int rc = mg_backend_open(MG_DEVICE_CUDA, &o, &gpu, err, sizeof(err));
    is_int(rc, 0, "the CUDA backend starts: %s", rc == 0 ? gpu->name : err);
    if (rc < 0)
        return done_testing();

    test_memory();
    test_linear(1, 1, 1, 1, 0);
    test_linear(5, 7, 3, 0, 0);
    test_linear(64, 784, 256, 1, 1);
    test_linear(64, 256, 10, 1, 0);
    test_linear(33, 100, 65, 0, 1);
    for (int sparse = 0; sparse < 2; sparse++) {
        test_conv(3, 2, 9, 8, 4, 3, 1, 0, 0, sparse);
        test_conv(2, 3, 9, 9, 5, 3, 2, 1, 1, sparse);
        test_conv(2, 1, 7, 6, 3, 5, 1, 2, 1, sparse);
        test_conv(64, 1, 28, 28, 32, 5, 1, 0, 1, sparse);  /* the cnn's first conv */
        test_conv(64, 32, 12, 12, 64, 5, 1, 0, 1, sparse); /* and its second */
    }
    test_pool(2 * 32, 24, 24, 2, 2);
    test_pool(5, 9, 7, 2, 2);
    test_pool(3, 9, 11, 3, 2);
    test_pool(4, 10, 10, 3, 3);
    test_elementwise(1);
    test_elementwise(1000003);
    test_xent(64, 10);
    test_xent(257, 1000);
    test_optim(1);
    test_optim(203530);
    test_overlap();
    test_errors();
    test_sync_free();
    test_model("mlp");
    test_model("cnn");

    mg_backend_release(gpu);
    mg_backend_release(cpu);
    return done_testing();
}
