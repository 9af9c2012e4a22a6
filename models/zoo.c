/* The model zoo (see models.h): layer lists for mlp and cnn. */
#include "models.h"
#include "mg_err.h"

#include <errno.h>
#include <string.h>

static int build_mlp(struct mg_layer_spec *s, const struct mg_model_options *opt)
{
    static const int default_hidden[] = {256};
    const int *hidden = default_hidden;
    int nh = 1, n = 0;
    if (opt && opt->nhidden > 0) {
        hidden = opt->hidden;
        nh = opt->nhidden > MG_MLP_MAX_HIDDEN ? MG_MLP_MAX_HIDDEN : opt->nhidden;
    }
    for (int i = 0; i < nh; i++) {
        s[n++] = (struct mg_layer_spec){.kind = MG_LAYER_LINEAR, .out = hidden[i]};
        s[n++] = (struct mg_layer_spec){.kind = MG_LAYER_RELU};
        if (opt && opt->dropout > 0.0f)
            s[n++] = (struct mg_layer_spec){.kind = MG_LAYER_DROPOUT, .p = opt->dropout};
    }
    s[n++] = (struct mg_layer_spec){.kind = MG_LAYER_LINEAR, .out = MG_MODEL_CLASSES};
    return n;
}

static int build_cnn(struct mg_layer_spec *s)
{
    int n = 0;
    s[n++] = (struct mg_layer_spec){.kind = MG_LAYER_CONV2D, .out = 32, .kernel = 5};
    s[n++] = (struct mg_layer_spec){.kind = MG_LAYER_RELU};
    s[n++] = (struct mg_layer_spec){.kind = MG_LAYER_MAXPOOL2D, .kernel = 2};
    s[n++] = (struct mg_layer_spec){.kind = MG_LAYER_CONV2D, .out = 64, .kernel = 5};
    s[n++] = (struct mg_layer_spec){.kind = MG_LAYER_RELU};
    s[n++] = (struct mg_layer_spec){.kind = MG_LAYER_MAXPOOL2D, .kernel = 2};
    s[n++] = (struct mg_layer_spec){.kind = MG_LAYER_FLATTEN};
    s[n++] = (struct mg_layer_spec){.kind = MG_LAYER_LINEAR, .out = 128};
    s[n++] = (struct mg_layer_spec){.kind = MG_LAYER_RELU};
    s[n++] = (struct mg_layer_spec){.kind = MG_LAYER_LINEAR, .out = MG_MODEL_CLASSES};
    return n;
}

int mg_model_create(struct mg_model *m, struct mg_backend *be, const char *name,
                    const struct mg_model_options *opt, int max_batch, char *err)
{
    struct mg_layer_spec specs[MG_MAX_LAYERS];
    int n;
    int dims[3] = {MG_MODEL_INPUT_C, MG_MODEL_INPUT_H, MG_MODEL_INPUT_W};
    if (!strcmp(name, "mlp")) {
        n = build_mlp(specs, opt);
        dims[0] = MG_MODEL_INPUT_C * MG_MODEL_INPUT_H * MG_MODEL_INPUT_W;
        dims[1] = dims[2] = 1;
    } else if (!strcmp(name, "cnn")) {
        n = build_cnn(specs);
    } else {
        return mg_seterr(err, MG_ERRMSG_LEN, -ENOENT, "unknown model '%s' (known: %s)", name,
                         mg_model_names());
    }
    return mg_model_init(m, be, name, dims, MG_MODEL_CLASSES, specs, n, max_batch, err);
}

const char *mg_model_names(void)
{
    return "mlp, cnn";
}
