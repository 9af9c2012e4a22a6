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
    switch (mode) {
    case MG_SAMPLER_PAD:
        s->num_samples = (int)(((long)n + world - 1) / world);
        break;
    case MG_SAMPLER_DROP_LAST:
        s->num_samples = n / world;
        break;
    case MG_SAMPLER_UNEVEN:
        s->num_samples = n / world + (rank < n % world);
        break;
    default:
        return -EINVAL;
    }
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

void mg_sampler_set_epoch(struct mg_sampler *s, long epoch)
{
    if (s->epoch == epoch)
        return;
    s->epoch = epoch;
    if (s->shuffle) {
        /* g = torch.Generator(); g.manual_seed(seed + epoch); torch.randperm(n, generator=g) */
        mg_mt19937_seed(&s->gen, s->seed + (uint64_t)epoch);
        mg_rng_randperm(&s->gen, s->perm, s->n);
    } else {
        for (int i = 0; i < s->n; i++)
            s->perm[i] = i;
    }
    /* element k of the padded list is perm[k mod n]: the wrap-around padding */
    for (int i = 0; i < s->num_samples; i++) {
        long k = (long)s->rank + (long)i * s->world;
        s->indices[i] = s->perm[k % s->n];
    }
}
