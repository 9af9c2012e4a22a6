/* The CUDA backend's own kernels, run on the host: runtime/cuda/cuda_kernels.cu
 * built by g++ through the SIMT shim (runtime/cuda/simt_host.h: every CUDA
 * thread a fiber), compared launcher by launcher with the CPU kernels
 * (cpu_kernels.c) that define what each must compute. Runs on every machine;
 * no CUDA toolkit or GPU is involved.
 *
 * Elementwise, per-row and optimizer kernels must give the CPU's bits
 * (compared with memcmp); the block-per-row softmax sums in tree order and is
 * held to a stated tolerance. Every kernel runs at odd sizes and on grids of
 * 1, 3 and many blocks, so a stride or bounds mistake shows. The shim's own
 * checks (a barrier after an early return, a deadlock, a shuffle with a lane
 * that returned, launch limits) run in child processes.
 * timeout: 300 */
#include "comm_internal.h"
#include "cpu_kernels.h"
#include "cuda_kernels.h"
#include "rng.h"
#include "tap.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int simt_fault_sync_after_return(void);
int simt_fault_deadlock(void);
int simt_fault_shuffle_returned_lane(void);
int simt_fault_too_many_threads(void);
int simt_block_sum(float *out, const float *x, int n, int threads, int with_barrier);

/* grids of 1, 3 and many blocks, at widths that leave partial blocks and warps */
static const struct mgk_cfg grids[] = {
    {NULL, 1, 32},
    {NULL, 3, 64},
    {NULL, 97, 32},
    {NULL, 0, 0}, /* what the backend uses: enough blocks of 256 */
};
#define NGRIDS (int)(sizeof(grids) / sizeof(grids[0]))

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;

static uint32_t next_u32(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

/* values of varied sign and magnitude, with zeros and negative zeros */
static float next_float(void)
{
    uint32_t r = next_u32();
    switch (r % 16) {
    case 0:
        return 0.0f;
    case 1:
        return -0.0f;
    default:
        return ldexpf((float)(int32_t)(r & 0xffffff) / (float)(1 << 23) - 1.0f,
                      (int)(r >> 24 & 7) - 3);
    }
}

static float *floats(size_t n)
{
    float *p = malloc((n ? n : 1) * sizeof(float));
    if (!p)
        BAIL_OUT("out of memory");
    for (size_t i = 0; i < n; i++)
        p[i] = next_float();
    return p;
}

static void *copy_of(const void *p, size_t bytes)
{
    void *q = malloc(bytes ? bytes : 1);
    if (!q)
        BAIL_OUT("out of memory");
    memcpy(q, p, bytes);
    return q;
}

static int same_bits(const void *a, const void *b, size_t bytes)
{
    return memcmp(a, b, bytes) == 0;
}

static const char *grid_name(const struct mgk_cfg *g)
{
    static char buf[4][32];
    static int k;
    char *b = buf[k++ % 4];
    if (g->blocks)
        snprintf(b, 32, "%d block%s of %d", g->blocks, g->blocks == 1 ? "" : "s", g->threads);
    else
        snprintf(b, 32, "auto grid");
    return b;
}

/* ---- layers ------------------------------------------------------------------------ */

static void test_bias_rows(void)
{
    static const int shapes[][2] = {{1, 1}, {7, 13}, {65, 33}};
    for (int s = 0; s < 3; s++)
        for (int g = 0; g < NGRIDS; g++) {
            int rows = shapes[s][0], cols = shapes[s][1], good = 1;
            size_t n = (size_t)rows * cols;
            float *y0 = floats(n), *b = floats((size_t)cols);
            for (int flags = 0; flags < 4; flags++) {
                const float *bias = flags & 1 ? b : NULL;
                int relu = flags >> 1;
                float *want = copy_of(y0, n * 4), *got = copy_of(y0, n * 4);
                mg_k_bias_rows(want, bias, rows, cols, relu);
                good &= mgk_bias_rows(&grids[g], got, bias, rows, cols, relu) == 0;
                good &= same_bits(want, got, n * 4);
                free(want);
                free(got);
            }
            ok(good, "bias_rows %dx%d, bias and relu on and off, %s: same bits", rows, cols,
               grid_name(&grids[g]));
            free(y0);
            free(b);
        }
}

static void test_colsum(void)
{
    static const int shapes[][2] = {{1, 1}, {64, 10}, {33, 129}};
    for (int s = 0; s < 3; s++)
        for (int g = 0; g < NGRIDS; g++) {
            int rows = shapes[s][0], cols = shapes[s][1], good = 1;
            float *dy = floats((size_t)rows * cols), *db0 = floats((size_t)cols);
            for (int acc = 0; acc < 2; acc++) {
                float *want = copy_of(db0, cols * 4), *got = copy_of(db0, cols * 4);
                mg_k_colsum(want, dy, rows, cols, acc);
                good &= mgk_colsum(&grids[g], got, dy, rows, cols, acc) == 0;
                good &= same_bits(want, got, cols * 4);
                free(want);
                free(got);
            }
            ok(good, "colsum %dx%d, accumulate on and off, %s: same bits", rows, cols,
               grid_name(&grids[g]));
            free(dy);
            free(db0);
        }
}

/* The cuDNN convolution's epilogue and its bias gradient, against the CPU's
 * dense conv path: mg_k_conv_out on [oc][n*P] and mg_k_sum per plane. */
static void test_conv_epilogue(void)
{
    static const int shapes[][3] = {{1, 1, 1}, {3, 5, 49}, {4, 32, 576}};
    for (int s = 0; s < 3; s++)
        for (int g = 0; g < NGRIDS; g++) {
            int n = shapes[s][0], oc = shapes[s][1], P = shapes[s][2], good = 1;
            size_t total = (size_t)n * oc * P;
            float *y0 = floats(total), *b = floats((size_t)oc), *t = floats(total);
            for (int si = 0; si < n; si++)
                for (int o = 0; o < oc; o++)
                    memcpy(t + (size_t)o * n * P + (size_t)si * P, y0 + ((size_t)si * oc + o) * P,
                           (size_t)P * 4);
            for (int flags = 0; flags < 4; flags++) {
                const float *bias = flags & 1 ? b : NULL;
                int relu = flags >> 1;
                float *want = malloc(total * 4), *got = copy_of(y0, total * 4);
                mg_k_conv_out(want, t, bias, n, oc, P, relu);
                good &= mgk_conv_bias(&grids[g], got, bias, n, oc, P, relu) == 0;
                good &= same_bits(want, got, total * 4);
                free(want);
                free(got);
            }
            ok(good, "conv bias+relu epilogue n=%d oc=%d P=%d, %s: same bits as mg_k_conv_out", n,
               oc, P, grid_name(&grids[g]));

            /* db: the sum of each plane (mg_k_sum's order), then over samples in order */
            float *db0 = floats((size_t)oc), *part = malloc((size_t)n * oc * 4);
            for (int acc = 0; acc < 2; acc++) {
                float *want = copy_of(db0, oc * 4), *got = copy_of(db0, oc * 4);
                if (!acc)
                    memset(want, 0, oc * 4);
                for (int si = 0; si < n; si++)
                    for (int o = 0; o < oc; o++)
                        want[o] += mg_k_sum(y0 + ((size_t)si * oc + o) * P, (size_t)P);
                good = mgk_row_sums16(&grids[g], part, y0, n * oc, (size_t)P) == 0;
                good &= mgk_colsum(&grids[g], got, part, n, oc, acc) == 0;
                ok(good && same_bits(want, got, oc * 4),
                   "conv db n=%d oc=%d P=%d accumulate=%d, %s: same bits as the CPU's dense path",
                   n, oc, P, acc, grid_name(&grids[g]));
                free(want);
                free(got);
            }
            free(db0);
            free(part);
            free(y0);
            free(b);
            free(t);
        }
}

static void test_elementwise(void)
{
    static const size_t sizes[] = {1, 31, 1000, 4099};
    for (int si = 0; si < 4; si++)
        for (int g = 0; g < NGRIDS; g++) {
            size_t n = sizes[si];
            const struct mgk_cfg *c = &grids[g];
            float *x = floats(n), *y = floats(n), *dy = floats(n);
            float *want = malloc(n * 4), *got = malloc(n * 4);
            int good;

            mg_k_relu(want, x, n);
            good = mgk_relu(c, got, x, n) == 0 && same_bits(want, got, n * 4);
            mg_k_relu_mask(want, dy, y, n);
            good &= mgk_relu_mask(c, got, dy, y, n) == 0 && same_bits(want, got, n * 4);
            /* in place: dx == dy */
            memcpy(got, dy, n * 4);
            good &= mgk_relu_mask(c, got, got, y, n) == 0 && same_bits(want, got, n * 4);
            memcpy(want, x, n * 4);
            memcpy(got, x, n * 4);
            mg_k_scale(want, 0.37f, n);
            good &= mgk_scale(c, got, 0.37f, n) == 0 && same_bits(want, got, n * 4);
            ok(good, "relu, relu mask (also in place), scale n=%zu, %s: same bits", n,
               grid_name(c));

            /* the average after a sum, as the CPU collectives compute it */
            for (int world = 2; world <= 7; world += 5) {
                const float *src[1] = {x};
                mg_reduce_f32(want, NULL, src, 1, n, world);
                memcpy(got, x, n * 4);
                good = mgk_div(c, got, (float)world, n) == 0 && same_bits(want, got, n * 4);
                ok(good, "divide by world size %d n=%zu, %s: same bits as mg_reduce_f32", world, n,
                   grid_name(c));
            }
            free(x);
            free(y);
            free(dy);
            free(want);
            free(got);
        }
}

static void test_dropout(void)
{
    int good = 1;
    for (uint64_t i = 0; i < 100000; i++) {
        uint64_t seed = i * 0x9e3779b97f4a7c15ULL, at = i << (i % 41);
        good &= mgk_counter_u32(seed, at) == mg_rng_counter_u32(seed, at);
    }
    ok(good, "the counter generator gives mg_rng_counter_u32's numbers (100000 draws)");

    static const float ps[] = {0.0f, 0.1f, 0.5f, 0.999f, 1.0f};
    static const size_t sizes[] = {1, 33, 5000};
    for (int pi = 0; pi < 5; pi++)
        for (int si = 0; si < 3; si++)
            for (int g = 0; g < NGRIDS; g++) {
                size_t n = sizes[si];
                float p = ps[pi];
                uint64_t seed = 1234 + pi, offset = (uint64_t)si << 36;
                float *x = floats(n), *dy = floats(n);
                float *yw = malloc(n * 4), *yg = malloc(n * 4);
                uint8_t *mw = malloc(n), *mg = malloc(n);
                mg_k_dropout_fwd(yw, mw, x, n, p, seed, offset);
                good = mgk_dropout_fwd(&grids[g], yg, mg, x, n, p, seed, offset) == 0;
                good &= same_bits(yw, yg, n * 4) && same_bits(mw, mg, n);
                mg_k_dropout_bwd(yw, dy, mw, n, p);
                good &= mgk_dropout_bwd(&grids[g], yg, dy, mg, n, p) == 0;
                good &= same_bits(yw, yg, n * 4);
                ok(good, "dropout p=%g n=%zu offset 2^%d, %s: same masks and bits", (double)p, n,
                   si * 36, grid_name(&grids[g]));
                free(x);
                free(dy);
                free(yw);
                free(yg);
                free(mw);
                free(mg);
            }
}

static void test_maxpool(void)
{
    /* planes, h, w, k, stride: the models' 2x2/2, odd sizes, overlapping windows */
    static const int cases[][5] = {
        {1, 2, 2, 2, 2},  {6, 24, 24, 2, 2}, {5, 9, 7, 2, 2},
        {3, 9, 11, 3, 2}, {4, 10, 10, 3, 3}, {2, 7, 9, 3, 1},
    };
    for (int ci = 0; ci < 6; ci++)
        for (int g = 0; g < NGRIDS; g++) {
            int planes = cases[ci][0], h = cases[ci][1], w = cases[ci][2], k = cases[ci][3];
            int stride = cases[ci][4], oh = (h - k) / stride + 1, ow = (w - k) / stride + 1;
            size_t in = (size_t)planes * h * w, out = (size_t)planes * oh * ow;
            float *x = floats(in), *dy = floats(out);
            /* ties (the first maximum wins) and a NaN (it always wins) */
            for (size_t i = 0; i + 1 < in; i += 5)
                x[i + 1] = x[i];
            if (in > 40)
                x[37] = NAN;
            float *yw = malloc(out * 4), *yg = malloc(out * 4);
            int32_t *iw = malloc(out * 4), *ig = malloc(out * 4);
            float *dw = malloc(in * 4), *dg = floats(in);
            mg_k_maxpool_fwd(yw, iw, x, planes, h, w, k, stride, oh, ow);
            int good = mgk_maxpool_fwd(&grids[g], yg, ig, x, planes, h, w, k, stride, oh, ow) == 0;
            good &= same_bits(yw, yg, out * 4) && same_bits(iw, ig, out * 4);
            mg_k_maxpool_bwd(dw, dy, iw, planes, h, w, oh, ow);
            good &= mgk_maxpool_bwd(&grids[g], dg, dy, ig, planes, h, w, k, stride, oh, ow) == 0;
            good &= same_bits(dw, dg, in * 4);
            ok(good, "maxpool %dx%dx%d k=%d stride=%d (ties, NaN), %s: same values, indices, dx",
               planes, h, w, k, stride, grid_name(&grids[g]));
            free(x);
            free(dy);
            free(yw);
            free(yg);
            free(iw);
            free(ig);
            free(dw);
            free(dg);
        }
}

/* ---- loss ------------------------------------------------------------------------------ */

/* Logits spread wide for few classes (probabilities down to the denormals), narrow
 * for many (so that a sum of a thousand terms has a thousand that count). */

static void make_logits(float *z, int32_t *labels, int n, int classes)
{
    for (int i = 0; i < n; i++) {
        for (int c = 0; c < classes; c++)
            z[(size_t)i * classes + c] = next_float() * (classes > 100 ? 1.0f : 8.0f);
        labels[i] = (int32_t)(next_u32() % (uint32_t)classes);
    }
    if (n > 3 && classes > 2) {
        /* a tie for the maximum, a NaN after element 0, a NaN at element 0 */
        z[classes + 2] = z[classes + 1] = 50.0f;
        z[2 * classes + 1] = NAN;
        z[3 * classes] = NAN;
    }
}

static void test_xent(void)
{
    static const int shapes[][2] = {{1, 1}, {1000, 10}, {257, 33}, {64, 1000}};
    for (int s = 0; s < 4; s++) {
        int n = shapes[s][0], classes = shapes[s][1];
        size_t total = (size_t)n * classes;
        float *z = malloc(total * 4), *pw = malloc(total * 4), *pg = malloc(total * 4);
        float *lw = malloc(n * 4), *lg = malloc(n * 4);
        int32_t *labels = malloc(n * 4), *cw = malloc(n * 4), *cg = malloc(n * 4);
        make_logits(z, labels, n, classes);
        mg_k_xent_fwd(lw, cw, pw, z, labels, n, classes);
        for (int g = 0; g < NGRIDS; g++) {
            int good = mgk_xent_fwd_rows(&grids[g], lg, cg, pg, z, labels, n, classes) == 0;
            good &= same_bits(lw, lg, n * 4) && same_bits(cw, cg, n * 4) &&
                    same_bits(pw, pg, total * 4);
            ok(good, "xent forward, a thread per row, n=%d classes=%d, %s: same bits", n, classes,
               grid_name(&grids[g]));
        }

        /* a block per row: the sums in tree order. Tolerances (relative): the
         * loss within 4e-6 of 1 + |loss|; each probability within 1e-6 + classes
         * * 6e-8 of itself, the bound of a sequential float sum of `classes`
         * terms (the CPU's, which is the less exact one); a denormal within 1e-42. */
        static const int widths[][2] = {{1, 32}, {3, 64}, {50, 96}, {0, 256}};
        for (int wi = 0; wi < 4; wi++) {
            struct mgk_cfg c = {NULL, widths[wi][0], widths[wi][1]};
            int good = mgk_xent_fwd_blocks(&c, lg, cg, pg, z, labels, n, classes) == 0;
            good &= same_bits(cw, cg, n * 4);
            double dl = 0, dp = 0;
            int nan_ok = 1;
            for (int i = 0; i < n; i++) {
                if (isnan(lw[i]) || isnan(lg[i])) {
                    nan_ok &= isnan(lw[i]) && isnan(lg[i]);
                    continue;
                }
                double e = fabs((double)lw[i] - lg[i]) / (1.0 + fabs((double)lw[i]));
                dl = e > dl ? e : dl;
                for (int k = 0; k < classes; k++) {
                    double a = pw[(size_t)i * classes + k], b = pg[(size_t)i * classes + k];
                    double pe = a == b ? 0.0 : fabs(a - b) / (fabs(a) + 1e-37);
                    dp = pe > dp ? pe : dp;
                }
            }
            double ptol = 1e-6 + classes * 6e-8;
            ok(good && nan_ok && dl <= 4e-6 && dp <= ptol,
               "xent forward, a block per row, n=%d classes=%d, %s: same correct[], NaN rows "
               "NaN, loss within %.1e (<= 4e-6), probabilities within %.1e (<= %.1e)",
               n, classes, grid_name(&c), dl, dp, ptol);
        }

        float *dw = malloc(total * 4), *dg = malloc(total * 4);
        float scale = 1.0f / (float)(n + 3);
        mg_k_xent_bwd(dw, pw, labels, n, classes, scale);
        for (int g = 0; g < NGRIDS; g++) {
            int good = mgk_xent_bwd(&grids[g], dg, pw, labels, n, classes, scale) == 0;
            ok(good && same_bits(dw, dg, total * 4), "xent backward n=%d classes=%d, %s: same bits",
               n, classes, grid_name(&grids[g]));
        }
        free(z);
        free(pw);
        free(pg);
        free(lw);
        free(lg);
        free(labels);
        free(cw);
        free(cg);
        free(dw);
        free(dg);
    }
}

/* ---- optimizers ------------------------------------------------------------------------ */

static void test_sgd(void)
{
    size_t n = 1031;
    for (int wd = 0; wd < 2; wd++)
        for (int mom = 0; mom < 2; mom++)
            for (int nest = 0; nest < 1 + mom; nest++)
                for (int g = 0; g < NGRIDS; g++) {
                    float *p = floats(n), *buf = floats(n);
                    float *pw = copy_of(p, n * 4), *bw = copy_of(buf, n * 4);
                    int good = 1;
                    for (int step = 0; step < 5; step++) {
                        float *grad = floats(n);
                        mg_k_sgd(pw, grad, bw, n, 0.05, mom ? 0.9 : 0.0, wd ? 0.01 : 0.0, nest,
                                 step == 0);
                        good &= mgk_sgd(&grids[g], p, grad, buf, n, 0.05, mom ? 0.9 : 0.0,
                                        wd ? 0.01 : 0.0, nest, step == 0) == 0;
                        free(grad);
                    }
                    good &= same_bits(pw, p, n * 4) && same_bits(bw, buf, n * 4);
                    ok(good, "sgd weight_decay=%d momentum=%d nesterov=%d, 5 steps, %s: same bits",
                       wd, mom, nest, grid_name(&grids[g]));
                    free(p);
                    free(buf);
                    free(pw);
                    free(bw);
                }
}

/* The loss accumulator over 9 micro-batches of odd sizes (steps of 3, one closed
 * with a NaN, a later one with an infinity): the CPU's doubles, bit for bit. */
static void test_loss_acc(void)
{
    for (int g = 0; g < NGRIDS; g++) {
        double want[MGK_ACC_LEN] = {0}, got[MGK_ACC_LEN] = {0};
        int good = 1;
        for (int k = 0; k < 9; k++) {
            int n = 1 + 37 * k % 61;
            float *loss = floats((size_t)n);
            int32_t *correct = malloc((size_t)n * sizeof(int32_t));
            for (int i = 0; i < n; i++) {
                loss[i] = fabsf(loss[i]) * 3.0f;
                correct[i] = (int32_t)(next_u32() & 1);
            }
            if (k == 4)
                loss[n / 2] = NAN;
            if (k == 7)
                loss[0] = INFINITY;
            int close = k % 3 == 2;
            mg_k_loss_acc(want, loss, correct, n, close, k / 3 + 1);
            good &= mgk_loss_acc(&grids[g], got, loss, correct, n, close, k / 3 + 1) == 0;
            free(loss);
            free(correct);
        }
        good &= same_bits(want, got, sizeof(want));
        ok(good && want[3] == 2.0 && isnan(want[4]) && want[2] > 0,
           "loss accumulator, 9 micro-batches in steps of 3, a NaN in step 2, %s: same bits",
           grid_name(&grids[g]));
    }
}

static void test_adamw(void)
{
    size_t n = 2053;
    for (int wd = 0; wd < 2; wd++)
        for (int g = 0; g < NGRIDS; g++) {
            float *p = floats(n), *m = calloc(n, 4), *v = calloc(n, 4);
            float *pw = copy_of(p, n * 4), *mw = calloc(n, 4), *vw = calloc(n, 4);
            int good = 1;
            for (uint64_t step = 1; step <= 10; step++) {
                float *grad = floats(n);
                mg_k_adamw(pw, grad, mw, vw, n, 1e-3, 0.9, 0.999, 1e-8, wd ? 0.01 : 0.0, step);
                good &= mgk_adamw(&grids[g], p, grad, m, v, n, 1e-3, 0.9, 0.999, 1e-8,
                                  wd ? 0.01 : 0.0, step) == 0;
                free(grad);
            }
            good &= same_bits(pw, p, n * 4) && same_bits(mw, m, n * 4) && same_bits(vw, v, n * 4);
            ok(good, "adamw weight_decay=%d, 10 steps, %s: same bits (p, m, v)", wd,
               grid_name(&grids[g]));
            free(p);
            free(m);
            free(v);
            free(pw);
            free(mw);
            free(vw);
        }
}

/* ---- the shim's own checks ------------------------------------------------------------- */

/* Runs f in a child; returns its stderr (static) and whether it died of SIGABRT. */
static int dies(int (*f)(void), char *msg, size_t len)
{
    int fds[2];
    if (pipe(fds) != 0)
        BAIL_OUT("pipe");
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0)
        BAIL_OUT("fork");
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        f();
        _exit(0);
    }
    close(fds[1]);
    size_t got = 0;
    ssize_t r;
    while (got + 1 < len && (r = read(fds[0], msg + got, len - 1 - got)) > 0)
        got += (size_t)r;
    msg[got] = '\0';
    msg[strcspn(msg, "\n")] = '\0';
    close(fds[0]);
    int st;
    waitpid(pid, &st, 0);
    return WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT;
}

static void test_shim(void)
{
    char msg[512];
    int d = dies(simt_fault_sync_after_return, msg, sizeof(msg));
    ok(d && strstr(msg, "__syncthreads() after 1 of the block's 64 threads returned"),
       "a __syncthreads() that a returned thread never reaches stops the run");
    diag("it said: %s", msg);
    d = dies(simt_fault_deadlock, msg, sizeof(msg));
    ok(d && strstr(msg, "deadlock: 48 threads wait at __syncthreads(), 16 at a warp"),
       "threads waiting at different barriers stop the run");
    diag("it said: %s", msg);
    d = dies(simt_fault_shuffle_returned_lane, msg, sizeof(msg));
    ok(d && strstr(msg, "lane 5, which returned"), "a shuffle waiting for a returned lane stops");
    diag("it said: %s", msg);
    is_int(simt_fault_too_many_threads(), 9,
           "2048 threads per block: cudaErrorInvalidConfiguration, as on a GPU");
    struct mgk_cfg wide = {NULL, 1, 2048};
    float x = 1.0f;
    is_int(mgk_relu(&wide, &x, &x, 1), 9, "a launcher reports its launch error");
    is_int(mgk_xent_fwd_blocks(&wide, &x, (int32_t *)&x, &x, &x, (const int32_t *)&x, 1, 1), 9,
           "the block softmax reports its launch error too");

    /* a block reduction with and without its barrier: the second must be caught */
    float *v = floats(1000), sum = 0.0f, first = 0.0f;
    double ref = 0;
    for (int i = 0; i < 1000; i++)
        ref += v[i];
    simt_block_sum(&sum, v, 1000, 256, 1);
    is_double(sum, ref, 1e-4, "a block sum with its barrier: %.6f (double: %.6f)", sum, ref);
    for (int i = 0; i < 1000; i++)
        v[i] = v[i] * 3.0f + 1.0f; /* new data: stale shared memory now holds wrong partials */
    ref = 0;
    for (int i = 0; i < 1000; i++)
        ref += v[i];
    simt_block_sum(&first, v, 1000, 256, 0);
    ok(fabs(first - ref) > 1e-2, "the same sum without its barrier is wrong: %.6f vs %.6f", first,
       ref);
    free(v);
}

int main(void)
{
    test_bias_rows();
    test_colsum();
    test_conv_epilogue();
    test_elementwise();
    test_dropout();
    test_maxpool();
    test_xent();
    test_sgd();
    test_adamw();
    test_loss_acc();
    test_shim();
    return done_testing();
}
