/* Optimizer configuration, state layout and learning-rate schedules
 * (the update arithmetic itself is in test_ops.c and test_golden.c).
 * timeout: 30 */
#include "backend.h"
#include "optim.h"
#include "mg_err.h"
#include "tap.h"

#include <errno.h>

int main(void)
{
    struct mg_backend *be;
    struct mg_optim_config c;
    struct mg_optim o;
    char err[MG_ERRMSG_LEN];
    if (mg_backend_create(MG_DEVICE_CPU, NULL, &be) < 0)
        BAIL_OUT("no CPU backend");

    mg_optim_defaults(&c, MG_OPTIM_ADAMW);
    ok(c.beta1 == 0.9 && c.beta2 == 0.999 && c.eps == 1e-8 && c.weight_decay == 0.01,
       "adamw defaults are PyTorch's");
    is_int(mg_optim_init(&o, be, &c, 100), 0, "adamw state");
    is_int(o.state_count, 200, "adamw keeps exp_avg and exp_avg_sq");
    mg_optim_release(&o);
    mg_optim_defaults(&c, MG_OPTIM_SGD);
    ok(c.momentum == 0 && c.weight_decay == 0, "sgd defaults are PyTorch's");
    is_int(mg_optim_init(&o, be, &c, 100), 0, "sgd without momentum");
    is_int(o.state_count, 0, "no momentum, no state");
    mg_optim_release(&o);
    c.momentum = 0.9;
    mg_optim_init(&o, be, &c, 100);
    is_int(o.state_count, 100, "sgd momentum buffer");
    mg_optim_release(&o);

    c.nesterov = 1;
    c.momentum = 0;
    is_int(mg_optim_check(&c, err), -EINVAL, "nesterov without momentum refused");
    c.momentum = 1.5;
    is_int(mg_optim_check(&c, err), -EINVAL, "momentum >= 1 refused");
    mg_optim_defaults(&c, MG_OPTIM_ADAMW);
    c.beta2 = 1.0;
    is_int(mg_optim_check(&c, err), -EINVAL, "beta2 = 1 refused");
    c.beta2 = 0.999;
    c.eps = 0;
    is_int(mg_optim_check(&c, err), -EINVAL, "eps = 0 refused");

    enum mg_optim_kind k;
    enum mg_sched_kind sk;
    ok(mg_optim_parse("adamw", &k) == 0 && k == MG_OPTIM_ADAMW, "parse adamw");
    is_int(mg_optim_parse("adam", &k), -EINVAL, "parse rejects adam");
    ok(mg_sched_parse("cosine", &sk) == 0 && sk == MG_SCHED_COSINE, "parse cosine");
    is_int(mg_sched_parse("linear", &sk), -EINVAL, "parse rejects linear");

    struct mg_schedule s = {.kind = MG_SCHED_CONSTANT, .base_lr = 0.1};
    is_double(mg_schedule_lr(&s, 0), 0.1, 0, "constant");
    is_double(mg_schedule_lr(&s, 12345), 0.1, 0, "constant later");
    s.warmup = 4;
    is_double(mg_schedule_lr(&s, 0), 0.025, 1e-12, "warmup step 0 = base/4");
    is_double(mg_schedule_lr(&s, 3), 0.1, 1e-12, "warmup reaches base at its last step");
    s = (struct mg_schedule){.kind = MG_SCHED_STEP, .base_lr = 1, .step_size = 10, .gamma = 0.5};
    is_double(mg_schedule_lr(&s, 9), 1, 0, "step: before the first decay");
    is_double(mg_schedule_lr(&s, 10), 0.5, 0, "step: first decay");
    is_double(mg_schedule_lr(&s, 35), 0.125, 0, "step: third decay");
    s.warmup = 5;
    is_double(mg_schedule_lr(&s, 14), 1, 0, "step counts after warmup");
    is_double(mg_schedule_lr(&s, 15), 0.5, 0, "step decays step_size after warmup");
    s = (struct mg_schedule){
        .kind = MG_SCHED_COSINE, .base_lr = 1, .warmup = 10, .total = 110, .min_lr = 0.1};
    is_double(mg_schedule_lr(&s, 4), 0.5, 1e-12, "cosine warmup is linear");
    is_double(mg_schedule_lr(&s, 10), 1, 1e-12, "cosine starts at base after warmup");
    is_double(mg_schedule_lr(&s, 60), 0.55, 1e-12, "cosine halfway");
    is_double(mg_schedule_lr(&s, 110), 0.1, 1e-12, "cosine ends at min_lr");
    is_double(mg_schedule_lr(&s, 500), 0.1, 1e-12, "cosine stays at min_lr");
    mg_backend_release(be);
    return done_testing();
}
