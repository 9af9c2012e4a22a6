/* How the CUDA backend picks a cuDNN convolution algorithm and moves to the
 * next when the chosen one fails as it runs (runtime/cuda/cuda_algo.h, used by
 * cuda_conv.c): the choice's filters in order (cuDNN's status, determinism,
 * math type, workspace, an earlier failure), the math types allowed without
 * TF32 (FMA, and DEFAULT, which cuDNN's legacy API might report for FMA-only
 * kernels), and the fallback: one retry with the next usable algorithm, never
 * a third try, never a failed algorithm again. Plain C, no cuDNN or GPU.
 * timeout: 30 */
#include "cuda_algo.h"
#include "tap.h"

#include <string.h>

#define TENSOR_OP  1 /* CUDNN_TENSOR_OP_MATH */
#define ALLOW_CONV 2

static struct mgcu_algo A(int algo, int math, size_t ws, int ok, int det) {
    return (struct mgcu_algo){.algo = algo,
                              .math = math,
                              .ws = ws,
                              .ok = (unsigned char)ok,
                              .deterministic = (unsigned char)det};
}

/* A convolution whose algorithms fail or run as the test says. */
struct fake {
    int fails[16]; /* status to return per algorithm number; 0 runs */
    int calls, seen[8], math[8];
};

static int fake_run(void *ctx, const struct mgcu_algo *a)
{
    struct fake *f = ctx;
    if (f->calls < 8) {
        f->seen[f->calls] = a->algo;
        f->math[f->calls] = a->math;
    }
    f->calls++;
    return f->fails[a->algo];
}

static void test_pick(void)
{
    struct mgcu_algos l = {.n = 6, .at = -1};
    l.a[0] = A(6, MGCU_MATH_FMA, 0, 0, 1);       /* cuDNN: not supported */
    l.a[1] = A(1, MGCU_MATH_FMA, 0, 1, 0);       /* not deterministic */
    l.a[2] = A(7, TENSOR_OP, 0, 1, 1);           /* tensor cores: TF32 only */
    l.a[3] = A(4, MGCU_MATH_FMA, 1 << 20, 1, 1); /* workspace too big for 64 KiB */
    l.a[4] = A(0, MGCU_MATH_FMA, 4096, 1, 1);
    l.a[5] = A(2, MGCU_MATH_FMA, 0, 1, 1);
    ok(mgcu_algo_pick(&l, 0, 65536) == 4,
       "the first that is supported, deterministic, FMA and fits");
    ok(mgcu_algo_pick(&l, 0, 1 << 20) == 3, "a bigger budget takes the earlier one");
    ok(mgcu_algo_pick(&l, 1, 65536) == 2, "with TF32 a tensor-op algorithm is allowed");
    ok(mgcu_algo_pick(&l, 0, 0) == 5, "no workspace: the first that needs none");
    l.a[5].bad = 1;
    ok(mgcu_algo_pick(&l, 0, 0) == -1, "one that failed before is never picked again");

    ok(mgcu_math_allowed(MGCU_MATH_FMA, 0) && mgcu_math_allowed(MGCU_MATH_DEFAULT, 0) &&
           !mgcu_math_allowed(TENSOR_OP, 0) && !mgcu_math_allowed(ALLOW_CONV, 0),
       "without TF32: FMA and DEFAULT math, no tensor-op math");
    ok(mgcu_math_allowed(TENSOR_OP, 1) && mgcu_math_allowed(ALLOW_CONV, 1) &&
           mgcu_math_allowed(MGCU_MATH_FMA, 1),
       "with TF32: any");
    /* the review's case: cuDNN reports DEFAULT for every algorithm of an FMA descriptor */
    struct mgcu_algos d = {.n = 3, .at = -1};
    d.a[0] = A(1, MGCU_MATH_DEFAULT, 0, 1, 0);
    d.a[1] = A(0, MGCU_MATH_DEFAULT, 0, 1, 1);
    d.a[2] = A(2, MGCU_MATH_DEFAULT, 0, 1, 1);
    ok(mgcu_algo_pick(&d, 0, 0) == 1,
       "every algorithm reported with DEFAULT math: one is still chosen");
}

static void test_fallback(void)
{
    struct mgcu_algos l = {.n = 4};
    l.a[0] = A(5, MGCU_MATH_FMA, 0, 1, 1);
    l.a[1] = A(3, MGCU_MATH_FMA, 8192, 1, 1); /* more workspace than the shape has */
    l.a[2] = A(1, TENSOR_OP, 0, 1, 1);        /* tensor cores */
    l.a[3] = A(0, MGCU_MATH_FMA, 1024, 1, 1);
    l.at = mgcu_algo_pick(&l, 0, 4096);
    struct fake f = {{0}};
    int first, tried;

    int st = mgcu_algo_run(&l, 0, 4096, fake_run, &f, &first, &tried);
    ok(st == 0 && first == 0 && tried == 1 && f.calls == 1 && f.seen[0] == 5,
       "the chosen algorithm runs: one call");

    memset(&f, 0, sizeof(f));
    f.fails[5] = 8; /* CUDNN_STATUS_EXECUTION_FAILED, say */
    st = mgcu_algo_run(&l, 0, 4096, fake_run, &f, &first, &tried);
    ok(st == 0 && first == 8 && tried == 2 && f.calls == 2 && f.seen[1] == 0,
       "it fails: the next usable one (skipping one too big and one with tensor cores) runs "
       "instead (algorithms %d then %d)",
       f.seen[0], f.seen[1]);
    ok(l.a[0].bad && l.a[l.at].algo == 0, "the failed one is marked, the new one is in use");
    memset(&f, 0, sizeof(f));
    f.fails[5] = 8;
    st = mgcu_algo_run(&l, 0, 4096, fake_run, &f, &first, &tried);
    ok(st == 0 && f.calls == 1 && f.seen[0] == 0, "the next step starts with the new one");

    /* the new one fails too: no third try; the error is the second's */
    memset(&f, 0, sizeof(f));
    f.fails[0] = 4;
    st = mgcu_algo_run(&l, 0, 4096, fake_run, &f, &first, &tried);
    ok(st == 4 && first == 4 && tried == 1 && f.calls == 1,
       "nothing usable is left: one try, its status returned");

    struct mgcu_algos m = {.n = 3};
    m.a[0] = A(5, MGCU_MATH_FMA, 0, 1, 1);
    m.a[1] = A(3, MGCU_MATH_FMA, 0, 1, 1);
    m.a[2] = A(0, MGCU_MATH_FMA, 0, 1, 1);
    m.at = 0;
    memset(&f, 0, sizeof(f));
    f.fails[5] = 9;
    f.fails[3] = 3;
    st = mgcu_algo_run(&m, 0, 0, fake_run, &f, &first, &tried);
    ok(st == 3 && first == 9 && tried == 2 && f.calls == 2,
       "the retry fails as well: the second status, after exactly two tries (not %d)", f.calls);

    /* with TF32 the run is told the math type cuDNN chose each algorithm with */
    struct mgcu_algos t = {.n = 2};
    t.a[0] = A(1, TENSOR_OP, 0, 1, 1);
    t.a[1] = A(0, MGCU_MATH_FMA, 0, 1, 1);
    t.at = mgcu_algo_pick(&t, 1, 0);
    memset(&f, 0, sizeof(f));
    f.fails[1] = 8;
    st = mgcu_algo_run(&t, 1, 0, fake_run, &f, &first, &tried);
    ok(st == 0 && f.math[0] == TENSOR_OP && f.math[1] == MGCU_MATH_FMA,
       "with TF32 each try carries its algorithm's math type (%d, then %d)", f.math[0], f.math[1]);
}

int main(void)
{
    test_pick();
    test_fallback();
    return done_testing();
}
