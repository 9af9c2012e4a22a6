/* PyTorch-compatible mt19937 and the counter-based dropout generator (see rng.h). */
#include "rng.h"

#include <math.h>

void mg_mt19937_seed(struct mg_mt19937 *g, uint64_t seed)
{
    /* at::mt19937 keeps the low 32 bits of the seed */
    g->state[0] = (uint32_t)seed;
    for (int j = 1; j < MG_MT_N; j++)
        g->state[j] = 1812433253u * (g->state[j - 1] ^ (g->state[j - 1] >> 30)) + (uint32_t)j;
    g->left = 1;
    g->next = 0;
}

#define MG_MT_M       397
#define MIXBITS(u, v) (((u)&0x80000000u) | ((v)&0x7fffffffu))
#define TWIST(u, v)   ((MIXBITS(u, v) >> 1) ^ (((v)&1u) ? 0x9908b0dfu : 0u))

static void mt_refill(struct mg_mt19937 *g)
{
    uint32_t *s = g->state;
    int j;
    for (j = 0; j < MG_MT_N - MG_MT_M; j++)
        s[j] = s[j + MG_MT_M] ^ TWIST(s[j], s[j + 1]);
    for (; j < MG_MT_N - 1; j++)
        s[j] = s[j + MG_MT_M - MG_MT_N] ^ TWIST(s[j], s[j + 1]);
    s[MG_MT_N - 1] = s[MG_MT_M - 1] ^ TWIST(s[MG_MT_N - 1], s[0]);
    g->left = MG_MT_N;
    g->next = 0;
}

uint32_t mg_mt19937_u32(struct mg_mt19937 *g)
{
    if (--g->left <= 0)
        mt_refill(g);
    uint32_t y = g->state[g->next++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
}

void mg_rng_uniform(struct mg_mt19937 *g, float *out, size_t n, double from, double to)
{
    /* at::uniform_real_distribution<float>: 24 random bits scaled to [0,1),
     * then x * (to - from) + from, which PyTorch's AVX2 build fuses into one FMA. */
    float f = (float)from, t = (float)to;
    for (size_t i = 0; i < n; i++) {
        float x = (float)(mg_mt19937_u32(g) & 0xffffffu) * (1.0f / 16777216.0f);
        out[i] = fmaf(x, t - f, f);
    }
}

void mg_rng_randperm(struct mg_mt19937 *g, int32_t *out, int32_t n)
{
    for (int32_t i = 0; i < n; i++)
        out[i] = i;
    for (int32_t i = 0; i + 1 < n; i++) {
        int32_t z = (int32_t)(mg_mt19937_u32(g) % (uint32_t)(n - i));
        int32_t t = out[i];
        out[i] = out[z + i];
        out[z + i] = t;
    }
}

uint32_t mg_rng_counter_u32(uint64_t seed, uint64_t i)
{
    /* splitmix64 over (seed, counter): stateless, so any element of the
     * stream can be produced in any order (on a GPU too). */
    uint64_t z = seed * 0xd1342543de82ef95ULL + (i + 1) * 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return (uint32_t)(z >> 32);
}
