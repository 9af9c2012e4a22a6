/* Optimizers and learning-rate schedules.
 *
 * The optimizer state is one flat allocation with the parameters' layout:
 * SGD keeps a momentum buffer [n] (none without momentum), AdamW keeps
 * exp_avg [n] then exp_avg_sq [n]. n is the model's parameter count, or with
 * ZeRO-1 (ddp.h) the size of this rank's shard: mg_optim_update then takes
 * where in the state a run of parameters has its state. Updates follow PyTorch 1.13's
 * torch.optim.SGD and torch.optim.AdamW (single-tensor path) operation by
 * operation; the only differences are FMA contractions PyTorch's vectorized
 * kernels make, i.e. the last bit of some elements.
 *
 * Schedules are per optimizer step (not per epoch):
 *   warmup  for step < warmup: lr = base * (step + 1) / warmup, for every schedule;
 *   constant  base;
 *   step    base * gamma ^ floor((step - warmup) / step_size);
 *   cosine  min_lr + (base - min_lr) * (1 + cos(pi * t)) / 2,
 *           t = (step - warmup) / (total - warmup), clamped to [0, 1].
 *
 * A function with a `char *err` argument writes what went wrong there: a
 * buffer of MG_ERRMSG_LEN bytes (mg_err.h). */
#ifndef MG_OPTIM_H
#define MG_OPTIM_H

#include "backend.h"
#include "mg_err.h"

#include <stddef.h>
#include <stdint.h>

enum mg_optim_kind {
    MG_OPTIM_SGD = 1,
    MG_OPTIM_ADAMW = 2,
};

struct mg_optim_config {
    enum mg_optim_kind kind;
    double momentum; /* sgd */
    int nesterov;    /* sgd: requires momentum > 0 */
    double weight_decay;
    double beta1, beta2, eps; /* adamw */
};

struct mg_optim {
    struct mg_optim_config cfg;
    struct mg_backend *be;
    size_t n;           /* parameters whose state is kept */
    float *state;       /* device, state_count floats */
    size_t state_count; /* 0, n or 2n: mg_optim_state_vectors(cfg) * n */
    uint64_t steps;     /* updates applied so far (AdamW's t before the next step) */
};

/* Fills PyTorch's defaults for kind: sgd momentum 0, weight decay 0;
 * adamw betas (0.9, 0.999), eps 1e-8, weight decay 0.01. */
void mg_optim_defaults(struct mg_optim_config *cfg, enum mg_optim_kind kind);
/* -EINVAL with a message for out-of-range hyperparameters. */
int mg_optim_check(const struct mg_optim_config *cfg, char *err);
int mg_optim_parse(const char *s, enum mg_optim_kind *out);
/* State vectors per parameter: 0 (sgd without momentum), 1 (momentum), 2 (adamw). */
int mg_optim_state_vectors(const struct mg_optim_config *cfg);
const char *mg_optim_name(enum mg_optim_kind kind);

int mg_optim_init(struct mg_optim *o, struct mg_backend *be, const struct mg_optim_config *cfg,
                  size_t nparams);
void mg_optim_release(struct mg_optim *o);
/* One update of params with grads at learning rate lr. */
void mg_optim_step(struct mg_optim *o, float *params, const float *grads, double lr);
/* The same update restricted to elements [offset, offset + count), without counting a
 * step: updating every range once and then incrementing o->steps equals one
 * mg_optim_step bit for bit (every element's update is independent). This lets an
 * update follow backward layer by layer, or DDP bucket by bucket. */
void mg_optim_update_range(struct mg_optim *o, float *params, const float *grads, double lr,
                           size_t offset, size_t count);
/* The same for count parameters p with gradients g whose state is at
 * state_offset of each state vector (ZeRO: a rank's shard keeps the state of
 * scattered runs of parameters back to back). */
void mg_optim_update(struct mg_optim *o, float *p, const float *g, size_t state_offset,
                     size_t count, double lr);

enum mg_sched_kind {
    MG_SCHED_CONSTANT = 1,
    MG_SCHED_STEP = 2,
    MG_SCHED_COSINE = 3,
};

struct mg_schedule {
    enum mg_sched_kind kind;
    double base_lr;
    long warmup;    /* steps */
    long total;     /* steps in the run (cosine) */
    long step_size; /* step schedule: steps between decays */
    double gamma;   /* step schedule: decay factor */
    double min_lr;  /* cosine floor */
};

int mg_sched_parse(const char *s, enum mg_sched_kind *out);
const char *mg_sched_name(enum mg_sched_kind kind);
/* Learning rate for optimizer step `step` (0-based). */
double mg_schedule_lr(const struct mg_schedule *s, long step);

#endif
