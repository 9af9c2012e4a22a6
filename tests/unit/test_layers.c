/* Models as layer sequences: parameter counts and names of mlp and cnn (as in
 * PyTorch), the flat layout (forward order, weight before bias, contiguous),
 * ReLU fusion, shape errors, the gradient-ready hook's order and ranges,
 * gradient accumulation, dropout in train/eval mode, the parameter hash.
 * timeout: 60 */
#include "backend.h"
#include "mg_err.h"
#include "model.h"
#include "models.h"
#include "tap.h"

#include <errno.h>

static struct mg_backend *be;

static void test_zoo(void)
{
    struct mg_model m;
    char err[MG_ERRMSG_LEN];
    is_int(mg_model_create(&m, be, "mlp", NULL, 64, err), 0, "mlp builds");
    is_int(m.nparams, 203530, "mlp has 203,530 parameters");
    is_int(m.ntensors, 4, "mlp has 4 tensors");
    is_str(m.params[0].name, "0.weight", "mlp tensor names follow nn.Sequential");
    is_str(m.params[3].name, "2.bias", "mlp last tensor is 2.bias");
    is_int(m.params[0].shape[0], 256, "0.weight is [256, 784]");
    is_int(m.params[0].shape[1], 784, "0.weight in_features 784");
    ok(m.layers[0].fused_relu && m.layers[1].fused, "linear+relu fused");
    mg_model_release(&m);

    is_int(mg_model_create(&m, be, "cnn", NULL, 64, err), 0, "cnn builds");
    is_int(m.nparams, 184586, "cnn has 184,586 parameters");
    static const char *names[] = {"0.weight", "0.bias", "3.weight", "3.bias",
                                  "7.weight", "7.bias", "9.weight", "9.bias"};
    int good = m.ntensors == 8;
    for (int i = 0; good && i < 8; i++)
        good = !strcmp(m.params[i].name, names[i]);
    ok(good, "cnn tensor names 0, 3, 7, 9 as in nn.Sequential");
    is_int(m.params[2].ndim, 4, "conv weight is 4-d");
    is_int(m.params[2].shape[1], 32, "3.weight is [64, 32, 5, 5]");
    is_int(m.layers[6].out_dims[0], 1024, "flatten gives 1024 features");
    size_t off = 0;
    good = 1;
    for (int i = 0; i < m.ntensors; i++) {
        good &= m.params[i].offset == off && m.params[i].data == m.param_buf + off &&
                m.grads[i].data == m.grad_buf + off;
        off += m.params[i].numel;
    }
    ok(good && off == m.nparams, "tensors are contiguous views of the flat buffers");
    ok(m.layers[0].param_offset == 0 &&
           m.layers[9].param_offset + m.layers[9].param_count == m.nparams,
       "layer ranges cover the buffer in forward order");
    ok(!m.layers[0].need_dx && m.layers[3].need_dx, "first layer skips dx");
    mg_model_release(&m);

    struct mg_model_options opt = {.hidden = {128, 64}, .nhidden = 2, .dropout = 0.5f};
    is_int(mg_model_create(&m, be, "mlp", &opt, 16, err), 0, "mlp with 2 hidden layers + dropout");
    is_int(m.nparams, 784 * 128 + 128 + 128 * 64 + 64 + 64 * 10 + 10, "its parameter count");
    is_int(m.layers[2].spec.kind, MG_LAYER_DROPOUT, "dropout after the first hidden relu");
    mg_model_release(&m);
    is_int(mg_model_create(&m, be, "resnet", NULL, 16, err), -ENOENT, "unknown model");
    ok(strstr(err, "unknown model 'resnet'") != NULL, "error names the model: %s", err);
}

static void test_shape_errors(void)
{
    struct mg_model m;
    char err[MG_ERRMSG_LEN];
    int in[3] = {1, 28, 28};
    struct mg_layer_spec bad1[] = {{.kind = MG_LAYER_CONV2D, .out = 4, .kernel = 3},
                                   {.kind = MG_LAYER_LINEAR, .out = 10}};
    is_int(mg_model_init(&m, be, "x", in, 10, bad1, 2, 4, err), -MG_ESHAPE,
           "linear on a 3-d activation is refused");
    ok(strstr(err, "flatten") != NULL, "message suggests a flatten: %s", err);
    struct mg_layer_spec bad2[] = {{.kind = MG_LAYER_CONV2D, .out = 4, .kernel = 40},
                                   {.kind = MG_LAYER_FLATTEN},
                                   {.kind = MG_LAYER_LINEAR, .out = 10}};
    is_int(mg_model_init(&m, be, "x", in, 10, bad2, 3, 4, err), -MG_ESHAPE,
           "kernel larger than the input is refused");
    struct mg_layer_spec bad3[] = {{.kind = MG_LAYER_FLATTEN}, {.kind = MG_LAYER_LINEAR, .out = 7}};
    is_int(mg_model_init(&m, be, "x", in, 10, bad3, 2, 4, err), -MG_ESHAPE,
           "output size must equal the class count");
    struct mg_layer_spec bad4[] = {{.kind = MG_LAYER_FLATTEN},
                                   {.kind = MG_LAYER_DROPOUT, .p = 1.0f},
                                   {.kind = MG_LAYER_LINEAR, .out = 10}};
    is_int(mg_model_init(&m, be, "x", in, 10, bad4, 3, 4, err), -EINVAL, "dropout p = 1 refused");
    struct mg_layer_spec pad[] = {
        {.kind = MG_LAYER_CONV2D, .out = 2, .kernel = 3, .stride = 2, .padding = 1},
        {.kind = MG_LAYER_MAXPOOL2D, .kernel = 3, .stride = 2},
        {.kind = MG_LAYER_FLATTEN},
        {.kind = MG_LAYER_LINEAR, .out = 10}};
    is_int(mg_model_init(&m, be, "x", in, 10, pad, 4, 4, err), 0, "strided, padded conv builds");
    is_int(m.layers[0].out_dims[1], 14, "conv 28 -> 14 with stride 2, padding 1");
    is_int(m.layers[1].out_dims[1], 6, "maxpool 3/2: 14 -> 6");
    mg_model_release(&m);
}

struct hook_log {
    int calls;
    size_t offs[16], counts[16];
};

static int hook(void *ctx, size_t off, size_t count)
{
    struct hook_log *h = ctx;
    if (h->calls < 16) {
        h->offs[h->calls] = off;
        h->counts[h->calls] = count;
    }
    h->calls++;
    return 0;
}

static int failing_hook(void *ctx, size_t off, size_t count)
{
    return -MG_EPEER;
}

static void fill_batch(struct mg_model *m, int n)
{
    size_t S = (size_t)m->in_dims[0] * m->in_dims[1] * m->in_dims[2];
    float *x = malloc(S * n * sizeof(float));
    int32_t *y = malloc(n * sizeof(int32_t));
    for (size_t i = 0; i < S * n; i++)
        x[i] = (float)((i * 2654435761u) % 1000) / 500.0f - 1.0f;
    for (int i = 0; i < n; i++)
        y[i] = i % m->classes;
    be->ops->upload(be, m->input, x, S * n * sizeof(float));
    be->ops->upload(be, m->labels, y, n * sizeof(int32_t));
    free(x);
    free(y);
}

static void test_backward_hook(void)
{
    struct mg_model m;
    char err[MG_ERRMSG_LEN];
    mg_model_create(&m, be, "cnn", NULL, 8, err);
    mg_model_init_params(&m, 3);
    fill_batch(&m, 8);
    struct hook_log h = {0};
    double loss;
    mg_model_forward(&m, 8, 1);
    mg_model_loss(&m, 8, &loss, NULL);
    is_int(mg_model_backward(&m, 8, 1.0f / 8, 0, hook, &h), 0, "backward with a hook");
    is_int(h.calls, 4, "hook called once per layer with parameters");
    int good = 1;
    size_t end = m.nparams;
    for (int i = 0; i < h.calls && i < 16; i++) {
        good &= h.offs[i] + h.counts[i] == end;
        end = h.offs[i];
    }
    ok(good && end == 0, "ranges are adjacent, descending, and cover the whole buffer");
    is_int(h.offs[0], m.layers[9].param_offset, "first call is the last layer");

    float *g1 = malloc(m.nparams * 4), *g2 = malloc(m.nparams * 4);
    mg_model_get_grads(&m, g1);
    mg_model_forward(&m, 8, 1);
    mg_model_loss(&m, 8, &loss, NULL);
    mg_model_backward(&m, 8, 1.0f / 8, 1, NULL, NULL);
    mg_model_get_grads(&m, g2);
    good = 1;
    float gmax = 0;
    for (size_t i = 0; i < m.nparams; i++)
        gmax = fabsf(g1[i]) > gmax ? fabsf(g1[i]) : gmax;
    /* the second pass adds sample by sample onto the first: rounding differs slightly */
    for (size_t i = 0; i < m.nparams; i++)
        good &= fabsf(g2[i] - 2 * g1[i]) <= 1e-5f * gmax;
    ok(good, "accumulate adds a second micro-batch's gradients");
    mg_model_forward(&m, 8, 1);
    mg_model_loss(&m, 8, &loss, NULL);
    mg_model_backward(&m, 8, 1.0f / 8, 0, NULL, NULL);
    mg_model_get_grads(&m, g2);
    ok(!memcmp(g1, g2, m.nparams * 4), "accumulate=0 overwrites: same bits as the first time");
    mg_model_forward(&m, 8, 1);
    mg_model_loss(&m, 8, &loss, NULL);
    is_int(mg_model_backward(&m, 8, 1.0f / 8, 0, failing_hook, NULL), -MG_EPEER,
           "a hook's error aborts the backward");
    free(g1);
    free(g2);
    mg_model_release(&m);
}

static void test_dropout_modes_and_hash(void)
{
    struct mg_model m;
    char err[MG_ERRMSG_LEN];
    struct mg_model_options opt = {.dropout = 0.5f};
    mg_model_create(&m, be, "mlp", &opt, 4, err);
    mg_model_init_params(&m, 0);
    fill_batch(&m, 4);
    float a[40], b[40], c[40];
    mg_model_forward(&m, 4, 0);
    memcpy(a, m.logits, sizeof(a));
    mg_model_forward(&m, 4, 0);
    memcpy(b, m.logits, sizeof(b));
    ok(!memcmp(a, b, sizeof(a)) && m.dropout_rng.offset == 0, "eval mode: no dropout, no RNG use");
    mg_model_forward(&m, 4, 1);
    memcpy(c, m.logits, sizeof(c));
    ok(memcmp(a, c, sizeof(a)) != 0 && m.dropout_rng.offset == 4 * 256,
       "train mode: dropout applied, RNG offset advanced by its elements");
    m.dropout_rng.offset = 0;
    mg_model_forward(&m, 4, 1);
    ok(!memcmp(c, m.logits, sizeof(c)), "same RNG state, same dropout mask");

    uint64_t h0 = mg_model_param_hash(&m);
    struct mg_model m2;
    mg_model_create(&m2, be, "mlp", &opt, 4, err);
    mg_model_init_params(&m2, 0);
    ok(mg_model_param_hash(&m2) == h0, "same seed: same parameter hash");
    mg_model_init_params(&m2, 1);
    ok(mg_model_param_hash(&m2) != h0, "another seed: another hash");
    float one;
    be->ops->download(be, &one, m.param_buf + 1000, 4);
    one = nextafterf(one, INFINITY);
    be->ops->upload(be, m.param_buf + 1000, &one, 4);
    ok(mg_model_param_hash(&m) != h0, "one bit of one parameter changes the hash");
    mg_model_release(&m);
    mg_model_release(&m2);
}

int main(void)
{
    if (mg_backend_create(MG_DEVICE_CPU, NULL, &be) < 0)
        BAIL_OUT("no CPU backend");
    test_zoo();
    test_shape_errors();
    test_backward_hook();
    test_dropout_modes_and_hash();
    mg_backend_release(be);
    return done_testing();
}
