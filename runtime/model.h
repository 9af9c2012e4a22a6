/* Models: a sequence of layers over three flat allocations.
 *
 * Parameters live in one buffer (param_buf), gradients in a second one with the
 * same layout (grad_buf); every weight and bias is a view (tensor.h). The
 * layout follows the layers in forward order, weight before bias, exactly like
 * PyTorch's state_dict. Backward walks the layers in reverse, so after layer i
 * the gradients in [layers[i].param_offset, nparams) are final: a contiguous
 * suffix of grad_buf that grows towards offset 0. The `ready` callback of
 * mg_model_backward() is called at each such point; DDP buckets are slices of
 * grad_buf cut from the end.
 *
 * Activations, activation gradients, the loss buffers and the conv scratch
 * share a third allocation sized for max_batch, so a training step allocates
 * nothing. All buffers are device memory of the model's backend.
 *
 * A function with a `char *err` argument writes what went wrong there: a
 * buffer of MG_ERRMSG_LEN bytes (mg_err.h). */
#ifndef MG_MODEL_H
#define MG_MODEL_H

#include "backend.h"
#include "mg_err.h"
#include "rng.h"
#include "tensor.h"

#include <stddef.h>
#include <stdint.h>

#define MG_MAX_LAYERS  32
#define MG_MAX_TENSORS 64

enum mg_layer_kind {
    MG_LAYER_LINEAR = 1,
    MG_LAYER_CONV2D,
    MG_LAYER_MAXPOOL2D,
    MG_LAYER_RELU,
    MG_LAYER_FLATTEN,
    MG_LAYER_DROPOUT,
};

struct mg_layer_spec {
    enum mg_layer_kind kind;
    int out;     /* linear: out_features; conv2d: out_channels */
    int kernel;  /* conv2d, maxpool2d: square kernel */
    int stride;  /* conv2d: 0 = 1; maxpool2d: 0 = kernel */
    int padding; /* conv2d */
    float p;     /* dropout probability */
};

struct mg_layer {
    struct mg_layer_spec spec;
    int in_dims[3], out_dims[3]; /* per sample (C, H, W); a flat vector is (F, 1, 1) */
    size_t in_size, out_size;    /* elements per sample */
    int weight, bias;            /* indices into mg_model.params, -1 when absent */
    size_t param_offset;         /* this layer's range in the flat buffers */
    size_t param_count;
    int fused_relu; /* applies the following ReLU inside its own kernel */
    int fused;      /* a ReLU applied by the previous layer: forward and backward are no-ops */
    int need_dx;    /* an earlier layer has parameters, so backward must produce dx */
    int sparse_dy;  /* conv followed by a max-pool: its output gradient is mostly zeros */
    float *out;     /* own output buffer, NULL for layers that return a view */
    int32_t *pool_idx;
    uint8_t *mask;
    /* set by the last forward */
    const float *x;
    float *y;
    int dropped; /* dropout was applied (training mode, p > 0) */
};

struct mg_model {
    char name[MG_NAME_MAX];
    struct mg_backend *be;
    int in_dims[3];
    int classes;
    int max_batch;
    int nlayers;
    struct mg_layer layers[MG_MAX_LAYERS];
    int ntensors;
    struct mg_tensor params[MG_MAX_TENSORS];
    struct mg_tensor grads[MG_MAX_TENSORS];
    size_t nparams;
    float *param_buf;
    float *grad_buf;
    void *arena; /* activations, their gradients, loss buffers, scratch */
    size_t arena_bytes;
    float *input;     /* [max_batch][in_size]: the trainer uploads a batch here */
    int32_t *labels;  /* [max_batch] */
    float *logits;    /* output of the last layer of the last forward */
    float *probs;     /* [max_batch][classes] */
    float *losses;    /* [max_batch] */
    int32_t *correct; /* [max_batch] */
    float *dbuf[2];   /* ping-pong activation gradients */
    void *scratch;
    float *host_losses; /* host copies for mg_model_loss() */
    int32_t *host_correct;
    struct mg_rng_state dropout_rng; /* advanced by every training forward with dropout */
};

/* Builds the model: checks every layer's shape, lays out the parameters and
 * allocates the three buffers. `in_dims` is one sample (C, H, W); the last
 * layer must produce `classes` values. Returns 0, -EINVAL / -MG_ESHAPE /
 * -MG_ETOOBIG (over a cap: tensors, parameters, activations) with a message
 * in err, or -ENOMEM. Parameters start at zero (see mg_model_init_params). */
int mg_model_init(struct mg_model *m, struct mg_backend *be, const char *name, const int in_dims[3],
                  int classes, const struct mg_layer_spec *specs, int nspecs, int max_batch,
                  char *err);
void mg_model_release(struct mg_model *m);

/* PyTorch's default initialization (nn.Linear / nn.Conv2d reset_parameters)
 * after torch.manual_seed(seed): the same seed gives the same bits. */
int mg_model_init_params(struct mg_model *m, uint64_t seed);

/* Copies all parameters from / to host memory (nparams floats, flat layout). */
void mg_model_set_params(struct mg_model *m, const float *host);
void mg_model_get_params(const struct mg_model *m, float *host);
void mg_model_get_grads(const struct mg_model *m, float *host);

void mg_model_zero_grad(struct mg_model *m);

/* Makes buf (nparams floats of the backend's memory, e.g. a communicator's
 * registered memory, see comm.h) the gradient buffer, with the current
 * gradients copied in, and returns the previous one. The caller owns the
 * returned buffer and must swap it back before mg_model_release(), which frees
 * whatever grad_buf is then. NULL or the current buffer changes nothing. */
float *mg_model_swap_grad_buf(struct mg_model *m, float *buf);
/* The same for the parameters (ZeRO-1 keeps them in registered memory, with
 * room for its padding): buf gets the current parameters. */
float *mg_model_swap_param_buf(struct mg_model *m, float *buf);

/* A tensor's layout as a fixed record: its name, NUL-padded to MG_NAME_MAX,
 * then ndim and the shape as little-endian u32 (the checkpoint's TENSORS
 * section, and DDP's check that every rank built the same model). */
#define MG_TENSOR_REC_BYTES (MG_NAME_MAX + 4 + 4 * MG_MAX_DIMS)
void mg_model_tensor_record(const struct mg_tensor *t, unsigned char rec[MG_TENSOR_REC_BYTES]);

/* Forward over the first n samples of m->input (n <= max_batch); logits land in
 * m->logits. train != 0 applies dropout. */
void mg_model_forward(struct mg_model *m, int n, int train);

/* Cross-entropy of the last forward against m->labels: per-sample losses and
 * correct flags on the device, and their sums (in sample order) on the host:
 * it waits for the device (the tests' and the reference's way). */
int mg_model_loss(struct mg_model *m, int n, double *loss_sum, long *correct);
/* The same, queued: the sums go into acc on the device (backend.h,
 * loss_accumulate: the same bits as mg_model_loss's), close ends step
 * `step`. Nothing waits; a report reads acc when it needs the figures. */
void mg_model_loss_queue(struct mg_model *m, int n, double *acc, int close, int64_t step);

/* Backward of the last forward and loss, with dlogits = (softmax - onehot) *
 * scale (scale = 1 / samples per optimizer step gives the mean). Gradients
 * overwrite grad_buf when accumulate == 0 (the first micro-batch of a step:
 * no zeroing needed) and are added to it otherwise. After each layer with parameters, ready(ctx, offset, count)
 * is called with that layer's range of grad_buf (in elements): the work that
 * produces it has been issued to the backend (on the CPU it is done; a device
 * backend must be synchronized, e.g. with an event, before reading it). Calls
 * come in reverse layer order, so the ranges are adjacent and descending. A
 * negative return aborts the backward and is returned. ready may be NULL.
 * Backward only queues its work: it returns an error the backend has already
 * seen (mg_backend_poll), and one of work still running shows at the next
 * sync or download. */
int mg_model_backward(struct mg_model *m, int n, float scale, int accumulate,
                      int (*ready)(void *ctx, size_t offset, size_t count), void *ctx);

/* mg_hash64 of the parameter bytes: equal on replicas that hold equal bits. */
uint64_t mg_model_param_hash(const struct mg_model *m);

#endif
