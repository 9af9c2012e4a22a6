/* Loads the BLAS the way the CPU backend does and says what runs, for
 * tests/integration/train_cpu_kernels.t (which also runs it on emulated CPUs)
 * and the benchmarks' peak figures:
 *   blas_info    prints "<core> <library's own choice or -> <origin>", then the
 *                banner text, then "<ISA of the kernels> <FLOP/cycle/core> <the
 *                CPU's ISA> <FLOP/cycle/core> <the family that fits the CPU>";
 *                exits 1 when the load fails or a product is wrong.
 *   blas_info --clock   prints the core's clock in GHz as it runs now (turbo
 *                included, which /proc/cpuinfo does not show in a VM): a chain of
 *                dependent register adds, one cycle each on every x86-64 (adds
 *                of a constant would not do: newer cores fold them at rename). */
#include "blas.h"
#include "cpu_features.h"

#include "rtutil.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#if defined(__x86_64__)
static double clock_ghz(void)
{
    double best = 0;
    for (int r = 0; r < 40; r++) {
        uint64_t x = 0, y = 3, n = 2 * 1000 * 1000;
        double t0 = mg_seconds();
        __asm__ volatile("1:\n\t"
                         "addq %2, %0\n\taddq %2, %0\n\taddq %2, %0\n\taddq %2, %0\n\t"
                         "addq %2, %0\n\taddq %2, %0\n\taddq %2, %0\n\taddq %2, %0\n\t"
                         "subq $1, %1\n\tjnz 1b"
                         : "+r"(x), "+r"(n)
                         : "r"(y));
        double ghz = 8 * 2e6 / (mg_seconds() - t0) / 1e9;
        if (ghz > best)
            best = ghz;
    }
    return best;
}
#else
static double clock_ghz(void)
{
    return 0;
}
#endif

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--clock") == 0) {
        printf("%.2f\n", clock_ghz());
        return 0;
    }
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
    struct mg_cpu_id id;
    mg_cpu_id_read(&id);
    enum mg_isa cpu = mg_cpu_isa(&id);
    int level = mg_openblas_core_isa(b->core);
    enum mg_isa kern = level < 0 || level > (int)cpu ? cpu : (enum mg_isa)level;
    const char *fits = mg_openblas_core_for(&id, "Katmai");
    printf("%s %d %s %d %s\n", mg_isa_name(kern), mg_isa_flops_per_cycle(kern), mg_isa_name(cpu),
           mg_isa_flops_per_cycle(cpu), fits ? fits : "-");
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
