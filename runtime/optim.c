/* SGD, AdamW and the learning-rate schedules (see optim.h). */
#include "optim.h"
#include "mg_err.h"

#include <errno.h>
#include <math.h>
#include <string.h>

void mg_optim_defaults(struct mg_optim_config *cfg, enum mg_optim_kind kind)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->kind = kind;
    cfg->beta1 = 0.9;
    cfg->beta2 = 0.999;
    cfg->eps = 1e-8;
    cfg->weight_decay = kind == MG_OPTIM_ADAMW ? 0.01 : 0.0;
}

int mg_optim_check(const struct mg_optim_config *c, char *err)
{
    if (c->kind != MG_OPTIM_SGD && c->kind != MG_OPTIM_ADAMW)
        return mg_seterr(err, MG_ERRMSG_LEN, -EINVAL, "unknown optimizer");
    if (!(c->weight_decay >= 0.0) || !isfinite(c->weight_decay))
        return mg_seterr(err, MG_ERRMSG_LEN, -EINVAL, "weight decay must be >= 0");
    if (c->kind == MG_OPTIM_SGD) {
        if (!(c->momentum >= 0.0 && c->momentum < 1.0))
            return mg_seterr(err, MG_ERRMSG_LEN, -EINVAL, "momentum must be in [0, 1)");
        if (c->nesterov && c->momentum == 0.0)
            return mg_seterr(err, MG_ERRMSG_LEN, -EINVAL,
                             "nesterov momentum requires a momentum > 0");
    } else {
        if (!(c->beta1 >= 0.0 && c->beta1 < 1.0) || !(c->beta2 >= 0.0 && c->beta2 < 1.0))
            return mg_seterr(err, MG_ERRMSG_LEN, -EINVAL, "adamw betas must be in [0, 1)");
        if (!(c->eps > 0.0) || !isfinite(c->eps))
            return mg_seterr(err, MG_ERRMSG_LEN, -EINVAL, "adamw eps must be > 0");
    }
    return 0;
}

int mg_optim_parse(const char *s, enum mg_optim_kind *out)
{
    if (!strcmp(s, "sgd"))
        *out = MG_OPTIM_SGD;
    else if (!strcmp(s, "adamw"))
        *out = MG_OPTIM_ADAMW;
    else
        return -EINVAL;
    return 0;
}

const char *mg_optim_name(enum mg_optim_kind kind)
{
    return kind == MG_OPTIM_ADAMW ? "adamw" : kind == MG_OPTIM_SGD ? "sgd" : "?";
}

int mg_optim_state_vectors(const struct mg_optim_config *cfg)
{
    return cfg->kind == MG_OPTIM_ADAMW ? 2 : cfg->momentum != 0.0 ? 1 : 0;
}

int mg_optim_init(struct mg_optim *o, struct mg_backend *be, const struct mg_optim_config *cfg,
                  size_t nparams)
{
    memset(o, 0, sizeof(*o));
    o->cfg = *cfg;
    o->be = be;
    o->n = nparams;
    o->state_count = (size_t)mg_optim_state_vectors(cfg) * nparams;
    if (o->state_count) {
        o->state = be->ops->alloc(be, o->state_count * sizeof(float));
        if (!o->state)
            return -ENOMEM;
    }
    return 0;
}

void mg_optim_release(struct mg_optim *o)
{
    if (o->be && o->state)
        o->be->ops->free(o->be, o->state);
    memset(o, 0, sizeof(*o));
}

void mg_optim_update(struct mg_optim *o, float *p, const float *g, size_t state_offset,
                     size_t count, double lr)
{
    struct mg_backend *be = o->be;
    const struct mg_optim_config *c = &o->cfg;
    size_t at = state_offset;
    if (c->kind == MG_OPTIM_ADAMW)
        be->ops->adamw_step(be, p, g, o->state + at, o->state + o->n + at, count, lr, c->beta1,
                            c->beta2, c->eps, c->weight_decay, o->steps + 1);
    else
        be->ops->sgd_step(be, p, g, o->state ? o->state + at : NULL, count, lr, c->momentum,
                          c->weight_decay, c->nesterov, o->steps == 0);
}

void mg_optim_update_range(struct mg_optim *o, float *params, const float *grads, double lr,
                           size_t offset, size_t count)
{
    mg_optim_update(o, params + offset, grads + offset, offset, count, lr);
}

void mg_optim_step(struct mg_optim *o, float *params, const float *grads, double lr)
{
    mg_optim_update_range(o, params, grads, lr, 0, o->n);
    o->steps++;
}

int mg_sched_parse(const char *s, enum mg_sched_kind *out)
{
    if (!strcmp(s, "constant"))
        *out = MG_SCHED_CONSTANT;
    else if (!strcmp(s, "step"))
        *out = MG_SCHED_STEP;
    else if (!strcmp(s, "cosine"))
        *out = MG_SCHED_COSINE;
    else
        return -EINVAL;
    return 0;
}

const char *mg_sched_name(enum mg_sched_kind kind)
{
    switch (kind) {
    case MG_SCHED_CONSTANT:
        return "constant";
    case MG_SCHED_STEP:
        return "step";
    case MG_SCHED_COSINE:
        return "cosine";
    }
    return "?";
}

double mg_schedule_lr(const struct mg_schedule *s, long step)
{
    if (step < 0)
        step = 0;
    if (step < s->warmup)
        return s->base_lr * (double)(step + 1) / (double)s->warmup;
    long t = step - s->warmup;
    switch (s->kind) {
    case MG_SCHED_STEP:
        return s->base_lr * pow(s->gamma, (double)(t / (s->step_size > 0 ? s->step_size : 1)));
    case MG_SCHED_COSINE: {
        long span = s->total - s->warmup;
        double x = span > 0 ? (double)t / (double)span : 1.0;
        if (x > 1.0)
            x = 1.0;
        return s->min_lr + (s->base_lr - s->min_lr) * 0.5 * (1.0 + cos(M_PI * x));
    }
    case MG_SCHED_CONSTANT:
        break;
    }
    return s->base_lr;
}
