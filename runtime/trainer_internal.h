/* What trainer.c and trainer_ckpt.c share: how the training sampler and the
 * dropout streams are derived from the configuration, which a resumed run
 * must derive the same way. Not a public API. */
#ifndef MG_TRAINER_INTERNAL_H
#define MG_TRAINER_INTERNAL_H

#include "sampler.h"
#include "trainer.h"

#include <stdint.h>

static inline enum mg_sampler_mode mg_train_mode(const struct mg_train_config *cfg)
{
    return cfg->drop_last ? MG_SAMPLER_DROP_LAST : MG_SAMPLER_PAD;
}

static inline uint64_t mg_dropout_seed(uint64_t seed, int rank)
{
    /* distinct streams per rank; independent of the shuffle's mt19937 */
    return (seed ^ 0x64726f706f7574ULL) * 0x9e3779b97f4a7c15ULL + (uint64_t)rank;
}

#endif
