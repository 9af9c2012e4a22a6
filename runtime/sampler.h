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
 * Rank r takes elements r, r + world, r + 2*world, ... of that list.
 *
 * Positions. Call the permutation, repeated end to end, the epoch's order:
 * position k holds perm[k mod n]. A pass over the epoch with W ranks takes
 * positions 0 .. W * num_samples - 1, rank r those congruent to r mod W, so
 * the padding above is positions n and up. After every rank has taken its
 * first c samples, exactly positions [0, c * W) are taken: the epoch's
 * progress is one number, the same for any world size. A pass can therefore
 * begin at a position p > 0 (a run resumed mid-epoch with another world size,
 * see trainer.h): rank r takes positions p + r, p + r + W, ..., and the pass
 * ends where a pass from 0 would, counted over the n - p positions left:
 * ceil((n - p) / W) each (padding), floor((n - p) / W) (drop_last), or
 * (n - p) / W and one more for the first (n - p) mod W ranks (uneven). Every
 * sample of the epoch is then still taken at least once (padding) or at most
 * once (drop_last), as in a pass that never changed world size. */
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
    int num_samples;  /* this rank's samples in a whole epoch */
    int32_t *perm;    /* [n] scratch for the permutation */
    int32_t *indices; /* [pass_samples] this rank's samples of the current pass */
    long epoch;       /* -1 before the first mg_sampler_set_epoch() */
    long start;       /* position the current pass began at (0: a whole epoch) */
    int pass_samples; /* this rank's samples in the current pass (<= num_samples) */
    struct mg_mt19937 gen;
};

/* -EINVAL for a bad rank/world/n, -ENOMEM. */
int mg_sampler_init(struct mg_sampler *s, int n, int rank, int world, int shuffle,
                    enum mg_sampler_mode mode, uint64_t seed);
void mg_sampler_release(struct mg_sampler *s);
/* Computes indices for a whole epoch (no-op when it is already current). */
void mg_sampler_set_epoch(struct mg_sampler *s, long epoch);
/* Computes indices for a pass over the epoch that begins at position start
 * (0 <= start <= n; no-op when it is already current). */
void mg_sampler_set_pass(struct mg_sampler *s, long epoch, long start);

/* A rank's samples in a pass over an n-sample epoch from position start with
 * world ranks (the rules above); 0 when start >= n. */
long mg_sampler_pass_len(long n, int rank, int world, enum mg_sampler_mode mode, long start);

/* Batches of `batch` per epoch for this rank (the last one may be short). */
static inline long mg_sampler_batches(const struct mg_sampler *s, int batch)
{
    return ((long)s->num_samples + batch - 1) / batch;
}

#endif
