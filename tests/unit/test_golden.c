/* libmg against PyTorch: the reference files from tests/golden/gen.py hold, for
 * the mlp and cnn models, the initial weights for seed 0, a batch, its logits,
 * loss and gradients, and the weights after 3 steps of SGD (momentum, Nesterov
 * with weight decay, plain with weight decay) and AdamW. Every comparison
 * prints the largest difference, and the first line names the kernels mg's
 * figures came from (the tolerances hold for every OpenBLAS family: run it
 * with OPENBLAS_CORETYPE=Prescott, Sandybridge, Haswell or SkylakeX).
 * timeout: 60 */
#include "backend.h"
#include "gold.h"
#include "models.h"
#include "optim.h"
#include "mg_err.h"
#include "tap.h"

static struct mg_backend *be;

static void check(const struct gold *g, const char *name, const float *got, size_t n, double atol,
                  double rtol)
{
    const struct gold_rec *r = gold_get(g, name);
    if (!r) {
        ok(0, "record %s present", name);
        return;
    }
    int bad;
    double worst = gold_cmp(r, got, n, atol, rtol, &bad);
    ok(bad == 0, "%s: max |diff| %.3g over %u values (atol %g, rtol %g)", name, worst, r->count,
       atol, rtol);
    if (bad)
        diag("%d values out of tolerance, computed on %s", bad, be->name);
}

static void check_params(const struct gold *g, const struct mg_model *m, const char *prefix,
                         const float *host, double atol, double rtol)
{
    for (int t = 0; t < m->ntensors; t++) {
        char name[160];
        snprintf(name, sizeof(name), "%s.%s", prefix, m->params[t].name);
        check(g, name, host + m->params[t].offset, m->params[t].numel, atol, rtol);
    }
}

static void load_batch(struct mg_model *m, const struct gold *g)
{
    const struct gold_rec *x = gold_get(g, "input"), *y = gold_get(g, "labels");
    if (!x || !y || x->stride != 1 || y->stride != 1)
        BAIL_OUT("golden file lacks the input batch");
    be->ops->upload(be, m->input, x->data, x->numel * sizeof(float));
    be->ops->upload(be, m->labels, y->data, y->numel * sizeof(int32_t));
}

struct config {
    const char *name;
    enum mg_optim_kind kind;
    double lr, momentum, wd;
    int nesterov;
};

static void run_model(const char *model)
{
    char file[64], err[MG_ERRMSG_LEN];
    struct gold g;
    struct mg_model m;
    snprintf(file, sizeof(file), "%s.gold", model);
    if (gold_load(file, &g) < 0)
        BAIL_OUT("cannot read %s/%s", gold_dir(), file);
    int rc = mg_model_create(&m, be, model, NULL, 8, err);
    is_int(rc, 0, "%s builds", model);
    if (rc < 0)
        BAIL_OUT("%s", err);
    float *init = malloc(m.nparams * sizeof(float)), *buf = malloc(m.nparams * sizeof(float));

    /* the same seed gives PyTorch's initial weights, bit for bit */
    mg_model_init_params(&m, 0);
    mg_model_get_params(&m, init);
    check_params(&g, &m, "init", init, 0.0, 0.0);

    load_batch(&m, &g);
    double loss;
    long correct;
    mg_model_forward(&m, 8, 0);
    mg_model_loss(&m, 8, &loss, &correct);
    check(&g, "logits", m.logits, 80, 1e-5, 1e-4);
    float mean = (float)(loss / 8);
    check(&g, "loss", &mean, 1, 1e-6, 1e-5);
    mg_model_backward(&m, 8, 1.0f / 8, 0, NULL, NULL);
    mg_model_get_grads(&m, buf);
    check_params(&g, &m, "grad", buf, 1e-6, 1e-3);

    static const struct config configs[] = {
        {"sgd", MG_OPTIM_SGD, 0.05, 0.9, 0.0, 0},
        {"nesterov", MG_OPTIM_SGD, 0.05, 0.9, 5e-4, 1},
        {"plainsgd", MG_OPTIM_SGD, 0.1, 0.0, 1e-3, 0},
        {"adamw", MG_OPTIM_ADAMW, 1e-3, 0.0, 0.01, 0},
    };
    for (size_t c = 0; c < sizeof(configs) / sizeof(configs[0]); c++) {
        const struct config *cf = &configs[c];
        struct mg_optim_config oc;
        struct mg_optim opt;
        float losses[3];
        mg_optim_defaults(&oc, cf->kind);
        oc.momentum = cf->momentum;
        oc.weight_decay = cf->wd;
        oc.nesterov = cf->nesterov;
        mg_model_set_params(&m, init);
        is_int(mg_optim_init(&opt, be, &oc, m.nparams), 0, "%s: optimizer state", cf->name);
        for (int s = 0; s < 3; s++) {
            mg_model_forward(&m, 8, 1);
            mg_model_loss(&m, 8, &loss, &correct);
            losses[s] = (float)(loss / 8);
            mg_model_backward(&m, 8, 1.0f / 8, 0, NULL, NULL);
            mg_optim_step(&opt, m.param_buf, m.grad_buf, cf->lr);
        }
        char name[64];
        snprintf(name, sizeof(name), "%s.losses", cf->name);
        check(&g, name, losses, 3, 1e-5, 1e-5);
        mg_model_get_params(&m, buf);
        /* AdamW's first steps move every weight by about lr, whatever the gradient's
         * size, so its tolerance is relative to lr */
        check_params(&g, &m, cf->name, buf, cf->kind == MG_OPTIM_ADAMW ? 2e-5 : 2e-6, 1e-4);
        mg_optim_release(&opt);
    }
    free(init);
    free(buf);
    mg_model_release(&m);
    gold_free(&g);
}

int main(void)
{
    if (mg_backend_create(MG_DEVICE_CPU, NULL, &be) < 0)
        BAIL_OUT("no CPU backend");
    diag("mg computes on %s; the references are PyTorch's (tests/golden/gen.py)", be->name);
    run_model("mlp");
    run_model("cnn");
    mg_backend_release(be);
    return done_testing();
}
