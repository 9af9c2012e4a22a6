/* Which samples a rank sees, with torch.utils.data.DistributedSampler's rules.
 *
 * Every epoch starts from the permutation torch.randperm(n) draws from a
 * generator seeded with seed + epoch (identical on all ranks, and identical to
 * PyTorch's for the same seed), or 0..n-1 without shuffle. Then:
 *   MG_SAMPLER_PAD       the list is padded by wrapping around to a multiple of
 *                        world, so every rank gets ceil(n / world) samples
 *                        (PyTorch's default, drop_last=False);
 *   MG_SAMPLER_DROP_LAST the tail is dropped to a multiple of world, every rank
 *                        gets floor(n / world) (drop_last=True);
 *   MG_SAMPLER_UNEVEN    no padding and nothing dropped: ranks get n / world or
 *                        one more. For evaluation, where every sample must be
 *                        counted exactly once when sums are reduced.
 * Rank r takes elements r, r + world, r + 2*world, ... of that list. */
#ifndef MG_SAMPLER_H
#define MG_SAMPLER_H

#include "rng.h"

#include <stdint.h>

enum mg_sampler_mode {
    MG_SAMPLER_PAD = 0,
    MG_SAMPLER_DROP_LAST = 1,
    MG_SAMPLER_UNEVEN = 2,
};

struct mg_sampler {
    int n; /* dataset size */
    int rank, world;
    int shuffle;
    enum mg_sampler_mode mode;
    uint64_t seed;
    int num_samples;  /* this rank's samples per epoch */
    int32_t *perm;    /* [n] scratch for the permutation */
    int32_t *indices; /* [num_samples] this rank's samples for `epoch` */
    long epoch;       /* -1 before the first mg_sampler_set_epoch() */
    struct mg_mt19937 gen;
};

/* -EINVAL for a bad rank/world/n, -ENOMEM. */
int mg_sampler_init(struct mg_sampler *s, int n, int rank, int world, int shuffle,
                    enum mg_sampler_mode mode, uint64_t seed);
void mg_sampler_release(struct mg_sampler *s);
/* Computes indices for the epoch (no-op when it is already current). */
void mg_sampler_set_epoch(struct mg_sampler *s, long epoch);

/* Batches of `batch` per epoch for this rank (the last one may be short). */
static inline long mg_sampler_batches(const struct mg_sampler *s, int batch)
{
    return ((long)s->num_samples + batch - 1) / batch;
}

#endif
