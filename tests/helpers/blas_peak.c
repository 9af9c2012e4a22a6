/* Measures single-process sgemm GFLOP/s through libmg's BLAS loader (the same
 * library, kernels and thread count train uses), for tests/bench/train_bench.sh.
 *   blas_peak [threads]    prints: "<core> <GFLOP/s for n^3, n = 256 512 1024 2048>"
 * Each figure is the best single call over at least 0.2 s of calls: the small
 * sizes stay in cache, as the layers of the mlp and cnn do, the large ones do not. */
#include "blas.h"
#include "rtutil.h"

#include <stdio.h>
#include <stdlib.h>

static double peak(const struct mg_blas *b, int n)
{
    float *a = malloc(sizeof(float) * n * n), *bb = malloc(sizeof(float) * n * n),
          *c = malloc(sizeof(float) * n * n);
    for (long i = 0; i < (long)n * n; i++) {
        a[i] = (float)(i % 17) * 0.01f;
        bb[i] = (float)(i % 13) * 0.01f;
    }
    double best = 0, start = mg_seconds();
    for (int r = 0; r < 3 || mg_seconds() - start < 0.2; r++) {
        double t0 = mg_seconds();
        b->sgemm(MG_BLAS_ROW_MAJOR, MG_BLAS_NO_TRANS, MG_BLAS_NO_TRANS, n, n, n, 1.0f, a, n, bb, n,
                 0.0f, c, n);
        double g = 2.0 * n * n * (double)n / (mg_seconds() - t0) / 1e9;
        if (g > best)
            best = g;
    }
    free(a);
    free(bb);
    free(c);
    return best;
}

int main(int argc, char **argv)
{
    const struct mg_blas *b;
    char err[MG_ERRMSG_LEN];
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    if (mg_blas_load(threads, &b, err) < 0) {
        fprintf(stderr, "blas_peak: %s\n", err);
        return 1;
    }
    printf("%s", b->core[0] ? b->core : b->library);
    for (int n = 256; n <= 2048; n *= 2)
        printf(" %.1f", peak(b, n));
    printf("\n");
    return 0;
}
