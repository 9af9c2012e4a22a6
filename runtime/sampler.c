/* DistributedSampler semantics over a dataset of n samples (see sampler.h). */
#include "sampler.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int mg_sampler_init(struct mg_sampler *s, int n, int rank, int world, int shuffle,
                    enum mg_sampler_mode mode, uint64_t seed)
{
    memset(s, 0, sizeof(*s));
    if (n <= 0 || world <= 0 || rank < 0 || rank >= world)
        return -EINVAL;
    s->n = n;
    s->rank = rank;
    s->world = world;
    s->shuffle = shuffle;
    s->mode = mode;
    s->seed = seed;
    s->epoch = -1;
    if (mode != MG_SAMPLER_PAD && mode != MG_SAMPLER_DROP_LAST && mode != MG_SAMPLER_UNEVEN)
        return -EINVAL;
    s->num_samples = (int)mg_sampler_pass_len(n, rank, world, mode, 0);
    if (s->num_samples == 0)
        return -EINVAL; /* fewer samples than ranks with drop_last */
    s->perm = malloc(sizeof(int32_t) * (size_t)n);
    s->indices = malloc(sizeof(int32_t) * (size_t)s->num_samples);
    if (!s->perm || !s->indices) {
        mg_sampler_release(s);
        return -ENOMEM;
    }
    return 0;
}

void mg_sampler_release(struct mg_sampler *s)
{
    free(s->perm);
    free(s->indices);
    s->perm = s->indices = NULL;
}

static void permute(struct mg_sampler *s)
{
    if (s->shuffle) {
        /* g = torch.Generator(); g.manual_seed(seed + epoch); torch.randperm(n, generator=g) */
        mg_mt19937_seed(&s->gen, s->seed + (uint64_t)s->epoch);
        mg_rng_randperm(&s->gen, s->perm, s->n);
    } else {
        for (int i = 0; i < s->n; i++)
            s->perm[i] = i;
    }
}

long mg_sampler_pass_len(long n, int rank, int world, enum mg_sampler_mode mode, long start)
{
    long left = n - start;
    if (left <= 0 || world <= 0)
        return 0;
    switch (mode) {
    case MG_SAMPLER_PAD:
        return (left + world - 1) / world;
    case MG_SAMPLER_DROP_LAST:
        return left / world;
    case MG_SAMPLER_UNEVEN:
        return left / world + (rank < left % world);
    }
    return 0;
}

void mg_sampler_set_epoch(struct mg_sampler *s, long epoch)
{
    mg_sampler_set_pass(s, epoch, 0);
}

void mg_sampler_set_pass(struct mg_sampler *s, long epoch, long start)
{
    if (start < 0 || start > s->n)
        start = start < 0 ? 0 : s->n;
    if (s->epoch == epoch && s->start == start)
        return;
    int new_epoch = s->epoch != epoch;
    s->epoch = epoch;
    s->start = start;
    s->pass_samples = (int)mg_sampler_pass_len(s->n, s->rank, s->world, s->mode, start);
    if (new_epoch)
        permute(s);
    /* position k of the epoch's order is perm[k mod n]: the wrap-around padding */
    for (int i = 0; i < s->pass_samples; i++) {
        long k = start + (long)s->rank + (long)i * s->world;
        s->indices[i] = s->perm[k % s->n];
    }
}
