/* Loads the BLAS the way the CPU backend does and says what runs, for
 * tests/integration/train_cpu_kernels.t (which also runs it on emulated CPUs):
 *   blas_info    prints "<core> <library's own choice or -> <origin>", then the
 *                banner text; exits 1 when the load fails or a product is wrong. */
#include "blas.h"

#include <stdio.h>

int main(void)
{
    const struct mg_blas *b;
    char err[MG_ERRMSG_LEN], desc[256];
    if (mg_blas_load(1, &b, err) < 0) {
        fprintf(stderr, "blas_info: %s\n", err);
        return 1;
    }
    static const char *const origins[] = {"library", "features",   "openblas_env",
                                          "mg_env",  "mg_library", "library_only"};
    printf("%s %s %s\n", b->core[0] ? b->core : "-", b->library_core[0] ? b->library_core : "-",
           origins[b->origin]);
    mg_blas_describe(b, 1, desc, sizeof(desc));
    printf("%s\n", desc);
    /* a product big enough to go through the packed kernels, with exact sums */
    enum {
        N = 64
    };
    static float a[N * N], x[N * N], c[N * N];
    for (int i = 0; i < N * N; i++) {
        a[i] = (float)(i % 7);
        x[i] = (float)(i % 5);
    }
    b->sgemm(MG_BLAS_ROW_MAJOR, MG_BLAS_NO_TRANS, MG_BLAS_NO_TRANS, N, N, N, 1.0f, a, N, x, N, 0.0f,
             c, N);
    for (int i = 0; i < N; i++)
        for (int j = 0; j < N; j++) {
            float want = 0;
            for (int k = 0; k < N; k++)
                want += a[i * N + k] * x[k * N + j];
            if (c[i * N + j] != want) {
                fprintf(stderr, "blas_info: sgemm gave %g at (%d, %d), want %g\n", c[i * N + j], i,
                        j, want);
                return 1;
            }
        }
    return 0;
}
