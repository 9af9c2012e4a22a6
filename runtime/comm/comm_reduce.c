/* The elementwise fp32 reduction used by the CPU collectives, and how a buffer
 * is cut into per-rank chunks. The sum of each element is taken in a fixed
 * order (the order of the sources), so every rank that computes it, or copies
 * it, holds the same bits. Built with -O3; clones for AVX-512 and AVX2 are
 * picked at load time, so the binary still runs on any x86-64. */
#include "comm_internal.h"

#define BLOCK 1024 /* floats per pass: 4 KiB, stays in L1 */

/* Not with clang 14: it names the clones' dispatcher mg_reduce_f32n.ifunc,
 * which callers in other files do not find. */
#if defined(__x86_64__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__) &&                \
    !defined(__SANITIZE_THREAD__)
#define MG_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define MG_CLONES
#endif

MG_CLONES
void mg_reduce_f32n(float *const *out, int nout, const float *const *src, int nsrc, size_t n,
                    int divide_by)
{
    float acc[BLOCK];
    const float div = (float)divide_by;

    for (size_t b = 0; b < n; b += BLOCK) {
        size_t m = n - b < BLOCK ? n - b : BLOCK;
        const float *s0 = src[0] + b;
        if (nsrc == 1) {
            for (size_t i = 0; i < m; i++)
                acc[i] = s0[i];
        } else {
            const float *s1 = src[1] + b;
            for (size_t i = 0; i < m; i++)
                acc[i] = s0[i] + s1[i];
        }
        for (int q = 2; q < nsrc; q++) {
            const float *s = src[q] + b;
            for (size_t i = 0; i < m; i++)
                acc[i] += s[i];
        }
        if (divide_by > 1)
            for (size_t i = 0; i < m; i++)
                acc[i] = acc[i] / div;
        /* Every source of the block is read before any output is written, so
         * an output may be one of the sources. */
        for (int k = 0; k < nout; k++) {
            float *o = out[k] + b;
            for (size_t i = 0; i < m; i++)
                o[i] = acc[i];
        }
    }
}

void mg_reduce_f32(float *out1, float *out2, const float *const *src, int nsrc, size_t n,
                   int divide_by)
{
    float *out[2] = {out1, out2};
    mg_reduce_f32n(out, out2 ? 2 : 1, src, nsrc, n, divide_by);
}

void mg_split_chunks(size_t count, int n, size_t *off)
{
    size_t units = (count + 15) / 16;
    for (int c = 0; c <= n; c++) {
        size_t o = (size_t)((unsigned __int128)units * (unsigned)c / (unsigned)n) * 16;
        off[c] = o < count ? o : count;
    }
}
