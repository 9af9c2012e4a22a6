/* Random numbers for libmg.
 *
 * - mg_mt19937: PyTorch's CPU generator (the mt19937 behind torch.manual_seed).
 *   Weight initialization and the sampler's shuffle use it exactly as PyTorch
 *   does, so the same seed gives the same initial weights (nn.Linear/nn.Conv2d
 *   defaults) and the same permutation as torch.randperm.
 * - mg_rng_state: a counter-based generator for dropout. Its whole state is
 *   (seed, offset), like PyTorch's CUDA Philox state: it is saved in checkpoints
 *   and a GPU kernel can produce the same numbers. */
#ifndef MG_RNG_H
#define MG_RNG_H

#include <stddef.h>
#include <stdint.h>

#define MG_MT_N 624

struct mg_mt19937 {
    uint32_t state[MG_MT_N];
    int left;
    int next;
};

void mg_mt19937_seed(struct mg_mt19937 *g, uint64_t seed);
uint32_t mg_mt19937_u32(struct mg_mt19937 *g);

/* torch.Tensor.uniform_(from, to) on a float32 CPU tensor of n elements. */
void mg_rng_uniform(struct mg_mt19937 *g, float *out, size_t n, double from, double to);

/* torch.randperm(n, generator=g) for n < 2^31. */
void mg_rng_randperm(struct mg_mt19937 *g, int32_t *out, int32_t n);

struct mg_rng_state {
    uint64_t seed;
    uint64_t offset; /* numbers consumed so far */
};

/* The i-th 32-bit number of the stream (seed), independent of any state. */
uint32_t mg_rng_counter_u32(uint64_t seed, uint64_t i);

#endif
