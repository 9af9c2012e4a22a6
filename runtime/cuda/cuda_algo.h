/* Choosing a cuDNN convolution algorithm for one direction of one shape, and
 * moving to the next when the chosen one fails as it runs: the logic alone,
 * without cuDNN's types, so tests/unit/test_cuda_algo runs it on any machine.
 * cuda_conv.c fills the list from cudnnGet*Algorithm_v7 (cuDNN's order,
 * fastest first by its heuristics) and runs the convolutions through
 * mgcu_algo_run.
 *
 * Why a fallback: cuDNN's heuristics can list an algorithm as usable that
 * then fails when it runs (NOT_SUPPORTED, EXECUTION_FAILED, an allocation
 * inside the engine; NVIDIA/cudnn-frontend#16). PyTorch tries the next
 * candidate; so does mg, once per failure, and never goes back to a failed
 * one for that shape. */
#ifndef MG_CUDA_ALGO_H
#define MG_CUDA_ALGO_H

#include <stddef.h>

#define MGCU_ALGO_MAX 16
/* cudnnMathType_t's values (cuda_conv.c checks them against cuDNN's header) */
#define MGCU_MATH_DEFAULT 0 /* CUDNN_DEFAULT_MATH */
#define MGCU_MATH_FMA     3 /* CUDNN_FMA_MATH */

struct mgcu_algo {
    int algo;                    /* cudnnConvolution*Algo_t */
    int math;                    /* cudnnMathType_t cuDNN reported for it */
    size_t ws;                   /* workspace bytes */
    unsigned char ok;            /* cuDNN's status was success and its workspace size is known */
    unsigned char deterministic; /* CUDNN_DETERMINISTIC */
    unsigned char bad;           /* failed when it ran: not used again for this shape */
};

struct mgcu_algos {
    int n;  /* candidates, in cuDNN's order */
    int at; /* the one in use; -1: none */
    struct mgcu_algo a[MGCU_ALGO_MAX];
};

/* Without TF32 the convolution descriptor is set to CUDNN_FMA_MATH, so an
 * algorithm that reports FMA math is allowed, and so is one that reports
 * CUDNN_DEFAULT_MATH (the descriptor still rules out tensor cores; were
 * cuDNN's legacy API to report DEFAULT for FMA-only kernels, a filter on FMA
 * alone would reject every algorithm). Tensor-op math only with TF32. */
static inline int mgcu_math_allowed(int math, int tf32)
{
    return tf32 || math == MGCU_MATH_FMA || math == MGCU_MATH_DEFAULT;
}

/* The first usable candidate: cuDNN's status success, deterministic, its math
 * allowed, its workspace within limit, not failed before. -1 when none is. */
static inline int mgcu_algo_pick(const struct mgcu_algos *l, int tf32, size_t limit)
{
    for (int i = 0; i < l->n && i < MGCU_ALGO_MAX; i++) {
        const struct mgcu_algo *a = &l->a[i];
        if (a->ok && a->deterministic && !a->bad && mgcu_math_allowed(a->math, tf32) &&
            a->ws <= limit)
            return i;
    }
    return -1;
}

/* Runs the algorithm in use (run returns 0 or cuDNN's status). When it
 * fails: marks it bad, picks the next usable one within limit, and runs that,
 * once. Returns the last status (0: it ran); *first gets the first failure's
 * status (0 when the first try ran) and *tried how many runs there were. */
static inline int mgcu_algo_run(struct mgcu_algos *l, int tf32, size_t limit,
                                int (*run)(void *ctx, const struct mgcu_algo *a), void *ctx,
                                int *first, int *tried)
{
    *first = 0;
    *tried = 0;
    if (l->at < 0 || l->at >= l->n)
        return -1;
    int st = run(ctx, &l->a[l->at]);
    *tried = 1;
    if (st == 0)
        return 0;
    *first = st;
    l->a[l->at].bad = 1;
    int next = mgcu_algo_pick(l, tf32, limit);
    if (next < 0)
        return st;
    l->at = next;
    *tried = 2;
    return run(ctx, &l->a[next]);
}

#endif
