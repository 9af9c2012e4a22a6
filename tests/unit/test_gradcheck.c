/* Finite-difference gradient checks: for each layer kind (in a small model
 * that exercises its forward, backward and input-gradient paths) and for both
 * zoo models, analytic gradients of the summed cross-entropy against central
 * differences, per parameter on a sample of elements and along a random
 * direction through all parameters.
 *
 * fp32 central differences carry rounding noise and an occasional ReLU or
 * max-pool kink inside the step, so an element passes within
 * 2e-3 + 3e-2 * |g|, and at least 95% of the sampled elements must pass; the
 * derivative along the gradient (all elements at once) must agree to 1%.
 * timeout: 120 */
#include "backend.h"
#include "models.h"
#include "rng.h"
#include "mg_err.h"
#include "tap.h"

static struct mg_backend *be;
static struct mg_mt19937 gen;

static double urand(void)
{
    return (double)(mg_mt19937_u32(&gen) >> 8) / 16777216.0;
}

static double loss_at(struct mg_model *m, int n)
{
    struct mg_rng_state saved = m->dropout_rng;
    double loss;
    mg_model_forward(m, n, 1);
    mg_model_loss(m, n, &loss, NULL);
    m->dropout_rng = saved; /* the same dropout mask for every evaluation */
    return loss;
}

static void fill_batch(struct mg_model *m, int n)
{
    size_t S = (size_t)m->in_dims[0] * m->in_dims[1] * m->in_dims[2];
    float *x = malloc(S * n * sizeof(float));
    int32_t *y = malloc(n * sizeof(int32_t));
    for (size_t i = 0; i < S * n; i++)
        x[i] = (float)(urand() * 2 - 1);
    for (int i = 0; i < n; i++)
        y[i] = (int32_t)(mg_mt19937_u32(&gen) % (uint32_t)m->classes);
    be->ops->upload(be, m->input, x, S * n * sizeof(float));
    be->ops->upload(be, m->labels, y, n * sizeof(int32_t));
    free(x);
    free(y);
}

static void gradcheck(const char *what, struct mg_model *m, int n, int per_tensor)
{
    float *p = malloc(m->nparams * sizeof(float)), *g = malloc(m->nparams * sizeof(float));
    const float h = 3e-4f;
    fill_batch(m, n);
    mg_model_get_params(m, p);
    loss_at(m, n);
    mg_model_backward(m, n, 1.0f, 0, NULL, NULL); /* gradient of the sum */
    mg_model_get_grads(m, g);
    int checked = 0, passed = 0;
    double worst = 0;
    for (int t = 0; t < m->ntensors; t++) {
        const struct mg_tensor *x = &m->params[t];
        int k = per_tensor < (int)x->numel ? per_tensor : (int)x->numel;
        for (int j = 0; j < k; j++) {
            size_t i =
                x->offset + (k == (int)x->numel ? (size_t)j : mg_mt19937_u32(&gen) % x->numel);
            float orig = p[i];
            float up = orig + h, down = orig - h;
            be->ops->upload(be, m->param_buf + i, &up, 4);
            double lp = loss_at(m, n);
            be->ops->upload(be, m->param_buf + i, &down, 4);
            double lm = loss_at(m, n);
            be->ops->upload(be, m->param_buf + i, &orig, 4);
            double fd = (lp - lm) / ((double)up - (double)down);
            double err = fabs(fd - g[i]);
            checked++;
            if (err <= 2e-3 + 3e-2 * fabs(g[i]))
                passed++;
            if (err / (1e-2 + fabs(g[i])) > worst)
                worst = err / (1e-2 + fabs(g[i]));
        }
    }
    ok(passed >= checked * 0.95, "%s: %d of %d sampled gradients match (worst rel. error %.3g)",
       what, passed, checked, worst);

    /* directional derivative along the gradient: a step of norm eps changes the
     * loss by about eps * |g|, the largest signal over the rounding noise */
    float *v = malloc(m->nparams * sizeof(float)), *q = malloc(m->nparams * sizeof(float));
    double norm = 0;
    for (size_t i = 0; i < m->nparams; i++)
        norm += (double)g[i] * g[i];
    norm = sqrt(norm);
    for (size_t i = 0; i < m->nparams; i++)
        v[i] = (float)(g[i] / norm);
    double eps = 1e-3, lpm[2];
    for (int s = 0; s < 2; s++) {
        for (size_t i = 0; i < m->nparams; i++)
            q[i] = p[i] + (float)((s ? -eps : eps) * v[i]);
        mg_model_set_params(m, q);
        lpm[s] = loss_at(m, n);
    }
    mg_model_set_params(m, p);
    double fd = (lpm[0] - lpm[1]) / (2 * eps);
    ok(fabs(fd - norm) <= 1e-2 * norm, "%s: derivative along the gradient %.6g vs |g| %.6g", what,
       fd, norm);
    free(p), free(g), free(v), free(q);
}

static void layer_case(const char *what, const int in[3], const struct mg_layer_spec *specs, int k)
{
    struct mg_model m;
    char err[MG_ERRMSG_LEN];
    int rc = mg_model_init(&m, be, what, in, 5, specs, k, 4, err);
    is_int(rc, 0, "%s builds", what);
    if (rc < 0) {
        diag("%s", err);
        return;
    }
    mg_model_init_params(&m, 11);
    m.dropout_rng = (struct mg_rng_state){.seed = 5, .offset = 0};
    gradcheck(what, &m, 4, 40);
    mg_model_release(&m);
}

int main(void)
{
    mg_mt19937_seed(&gen, 7);
    if (mg_backend_create(MG_DEVICE_CPU, NULL, &be) < 0)
        BAIL_OUT("no CPU backend");
    const int flat[3] = {12, 1, 1}, img[3] = {2, 10, 10};
    {
        /* linear (with dx into a previous linear), fused relu */
        struct mg_layer_spec s[] = {{.kind = MG_LAYER_LINEAR, .out = 9},
                                    {.kind = MG_LAYER_RELU},
                                    {.kind = MG_LAYER_LINEAR, .out = 5}};
        layer_case("linear + relu (fused)", flat, s, 3);
    }
    {
        /* unfused relu and dropout between linears */
        struct mg_layer_spec s[] = {{.kind = MG_LAYER_LINEAR, .out = 9},
                                    {.kind = MG_LAYER_DROPOUT, .p = 0.3f},
                                    {.kind = MG_LAYER_RELU},
                                    {.kind = MG_LAYER_LINEAR, .out = 5}};
        layer_case("dropout + relu (unfused)", flat, s, 4);
    }
    {
        /* conv with stride and padding feeding a second conv (its dx), flatten */
        struct mg_layer_spec s[] = {
            {.kind = MG_LAYER_CONV2D, .out = 3, .kernel = 3, .stride = 2, .padding = 1},
            {.kind = MG_LAYER_CONV2D, .out = 4, .kernel = 3, .padding = 1},
            {.kind = MG_LAYER_FLATTEN},
            {.kind = MG_LAYER_LINEAR, .out = 5}};
        layer_case("conv2d stride 2 pad 1 -> conv2d pad 1", img, s, 4);
    }
    {
        /* conv + fused relu + maxpool, then an overlapping maxpool */
        struct mg_layer_spec s[] = {{.kind = MG_LAYER_CONV2D, .out = 3, .kernel = 3},
                                    {.kind = MG_LAYER_RELU},
                                    {.kind = MG_LAYER_MAXPOOL2D, .kernel = 2},
                                    {.kind = MG_LAYER_CONV2D, .out = 4, .kernel = 2},
                                    {.kind = MG_LAYER_MAXPOOL2D, .kernel = 2, .stride = 1},
                                    {.kind = MG_LAYER_RELU},
                                    {.kind = MG_LAYER_FLATTEN},
                                    {.kind = MG_LAYER_LINEAR, .out = 5}};
        layer_case("conv2d + relu + maxpool2d (2/2 and 2/1)", img, s, 8);
    }
    {
        struct mg_model m;
        char err[MG_ERRMSG_LEN];
        mg_model_create(&m, be, "mlp", NULL, 4, err);
        mg_model_init_params(&m, 0);
        gradcheck("mlp", &m, 4, 30);
        mg_model_release(&m);
        mg_model_create(&m, be, "cnn", NULL, 4, err);
        mg_model_init_params(&m, 0);
        gradcheck("cnn", &m, 4, 30);
        mg_model_release(&m);
    }
    mg_backend_release(be);
    return done_testing();
}
