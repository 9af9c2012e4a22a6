/* cuDNN's own shape arithmetic against mg's: descriptors and output shapes
 * are host-side in cuDNN, so this runs without a GPU, in the real library the
 * CUDA backend calls. Every convolution and max-pool layer of both models
 * (models/zoo.c; the MLP has none) at several batch sizes, a sweep of small
 * shapes with strides and padding, and the shapes both must refuse (cuDNN's
 * BAD_PARAM where mg says -EINVAL). The backend checks the same agreement
 * when it builds a convolution's descriptors (cuda_conv.c). */
#include "backend.h"
#include "gpu_test.h"
#include "models.h"
#include "tap.h"

#include <errno.h>
#include <string.h>

static const struct mg_gpu_plugin *plugin;

static int conv_agrees(struct mg_conv2d_dims d, char *why, size_t len)
{
    int out[4] = {0}, ours = mg_conv2d_dims_finish(&d);
    char err[MG_ERRMSG_LEN];
    int theirs = plugin->conv2d_out_dims(&d, out, err, sizeof(err));
    if (ours < 0 || theirs < 0) {
        snprintf(why, len, "mg %d, cuDNN %d (%.200s)", ours, theirs, theirs < 0 ? err : "");
        return (ours < 0) == (theirs < 0);
    }
    snprintf(why, len, "mg %dx%dx%dx%d, cuDNN %dx%dx%dx%d", d.n, d.oc, d.oh, d.ow, out[0], out[1],
             out[2], out[3]);
    return out[0] == d.n && out[1] == d.oc && out[2] == d.oh && out[3] == d.ow;
}

static int pool_agrees(struct mg_pool2d_dims d, char *why, size_t len)
{
    int out[4] = {0}, ours = mg_pool2d_dims_finish(&d);
    char err[MG_ERRMSG_LEN];
    int theirs = plugin->pool2d_out_dims(&d, out, err, sizeof(err));
    if (ours < 0 || theirs < 0) {
        snprintf(why, len, "mg %d, cuDNN %d (%.200s)", ours, theirs, theirs < 0 ? err : "");
        return (ours < 0) == (theirs < 0);
    }
    snprintf(why, len, "mg %dx%dx%dx%d, cuDNN %dx%dx%dx%d", d.n, d.c, d.oh, d.ow, out[0], out[1],
             out[2], out[3]);
    return out[0] == d.n && out[1] == d.c && out[2] == d.oh && out[3] == d.ow;
}

static void test_models(struct mg_backend *cpu)
{
    static const char *const names[] = {"mlp", "cnn"};
    static const int batches[] = {1, 64, 1000};
    for (int mi = 0; mi < 2; mi++)
        for (int bi = 0; bi < 3; bi++) {
            struct mg_model m;
            char err[MG_ERRMSG_LEN], why[300];
            int batch = batches[bi], checked = 0;
            if (mg_model_create(&m, cpu, names[mi], NULL, batch, err) < 0) {
                ok(0, "build %s: %s", names[mi], err);
                continue;
            }
            for (int i = 0; i < m.nlayers; i++) {
                const struct mg_layer *l = &m.layers[i];
                const struct mg_layer_spec *s = &l->spec;
                if (s->kind == MG_LAYER_CONV2D) {
                    struct mg_conv2d_dims d = {.n = batch,
                                               .c = l->in_dims[0],
                                               .h = l->in_dims[1],
                                               .w = l->in_dims[2],
                                               .oc = s->out,
                                               .kh = s->kernel,
                                               .kw = s->kernel,
                                               .stride = s->stride ? s->stride : 1,
                                               .pad = s->padding};
                    int good = conv_agrees(d, why, sizeof(why));
                    good &= !mg_conv2d_dims_finish(&d) && d.oh == l->out_dims[1] &&
                            d.ow == l->out_dims[2];
                    ok(good, "%s layer %d (conv %dx%d, %d -> %d channels), batch %d: %s", names[mi],
                       i, s->kernel, s->kernel, l->in_dims[0], s->out, batch, why);
                    checked++;
                } else if (s->kind == MG_LAYER_MAXPOOL2D) {
                    struct mg_pool2d_dims d = {.n = batch,
                                               .c = l->in_dims[0],
                                               .h = l->in_dims[1],
                                               .w = l->in_dims[2],
                                               .k = s->kernel,
                                               .stride = s->stride ? s->stride : s->kernel};
                    int good = pool_agrees(d, why, sizeof(why));
                    good &= !mg_pool2d_dims_finish(&d) && d.oh == l->out_dims[1] &&
                            d.ow == l->out_dims[2];
                    ok(good, "%s layer %d (max-pool %dx%d), batch %d: %s", names[mi], i, s->kernel,
                       s->kernel, batch, why);
                    checked++;
                }
            }
            if (!checked && bi == 0)
                diag("%s has no convolution or pooling layer (%d layers)", names[mi], m.nlayers);
            if (!strcmp(names[mi], "cnn"))
                is_int(checked, 4, "the cnn's 2 convolutions and 2 max-pools were all checked");
            mg_model_release(&m);
        }
}

static void test_sweep(void)
{
    int tried = 0, bad = 0, refused = 0;
    char why[300];
    for (int n = 1; n <= 3; n += 2)
        for (int h = 1; h <= 9; h++)
            for (int w = 1; w <= 9; w += 2)
                for (int k = 1; k <= 5; k++)
                    for (int stride = 1; stride <= 3; stride++)
                        for (int pad = 0; pad <= 2; pad++) {
                            struct mg_conv2d_dims d = {.n = n,
                                                       .c = 2,
                                                       .h = h,
                                                       .w = w,
                                                       .oc = 3,
                                                       .kh = k,
                                                       .kw = k > 1 ? k - 1 : k,
                                                       .stride = stride,
                                                       .pad = pad};
                            struct mg_conv2d_dims dd = d;
                            tried++;
                            refused += mg_conv2d_dims_finish(&dd) < 0;
                            if (!conv_agrees(d, why, sizeof(why)) && bad++ < 5)
                                diag("conv n=%d %dx%d k=%dx%d stride %d pad %d: %s", n, h, w, k,
                                     d.kw, stride, pad, why);
                        }
    ok(!bad && refused > 0,
       "%d convolution shapes (strides, padding, non-square kernels): cuDNN and mg agree on "
       "every output shape and on the %d they both refuse (%d disagree)",
       tried, refused, bad);
    tried = bad = refused = 0;
    for (int h = 1; h <= 12; h++)
        for (int w = 1; w <= 12; w++)
            for (int k = 1; k <= 4; k++)
                for (int stride = 1; stride <= 4; stride++) {
                    struct mg_pool2d_dims d = {
                        .n = 2, .c = 3, .h = h, .w = w, .k = k, .stride = stride};
                    struct mg_pool2d_dims dd = d;
                    tried++;
                    refused += mg_pool2d_dims_finish(&dd) < 0;
                    if (!pool_agrees(d, why, sizeof(why)) && bad++ < 5)
                        diag("pool %dx%d k=%d stride %d: %s", h, w, k, stride, why);
                }
    ok(!bad && refused > 0,
       "%d max-pool shapes: the same output shapes (floor mode) and the same %d refusals (%d "
       "disagree)",
       tried, refused, bad);
}

static void test_bad_param(void)
{
    int out[4];
    char err[MG_ERRMSG_LEN];
    struct mg_conv2d_dims d = {
        .n = 0, .c = 1, .h = 28, .w = 28, .oc = 32, .kh = 5, .kw = 5, .stride = 1};
    struct mg_conv2d_dims dd = d;
    is_int(mg_conv2d_dims_finish(&dd), -EINVAL, "an empty batch: mg refuses it");
    is_int(plugin->conv2d_out_dims(&d, out, err, sizeof(err)), -EINVAL, "... and so does cuDNN: %s",
           err);
    ok(strstr(err, "CUDNN_STATUS_BAD_PARAM") != NULL, "... with its BAD_PARAM");
    d = (struct mg_conv2d_dims){
        .n = 2, .c = 1, .h = 3, .w = 3, .oc = 4, .kh = 5, .kw = 5, .stride = 1, .pad = 0};
    is_int(plugin->conv2d_out_dims(&d, out, err, sizeof(err)), -EINVAL,
           "a kernel larger than the padded input: BAD_PARAM too (%s)", err);
}

int main(void)
{
    struct mg_backend *cpu;
    plugin = gpu_test_plugin_or_skip();
    if (mg_backend_create(MG_DEVICE_CPU, NULL, &cpu) < 0)
        BAIL_OUT("no CPU backend");
    test_models(cpu);
    test_sweep();
    test_bad_param();
    mg_backend_release(cpu);
    return done_testing();
}
