/* The model zoo: named architectures built on libmg's sequential models.
 *
 *   mlp  Linear(784, H) -> ReLU -> Linear(H, 10), H = 256 by default
 *        (203,530 parameters); several hidden sizes stack more Linear+ReLU.
 *   cnn  Conv2d(1,32,5) -> ReLU -> MaxPool2d(2) -> Conv2d(32,64,5) -> ReLU ->
 *        MaxPool2d(2) -> Flatten -> Linear(1024,128) -> ReLU -> Linear(128,10)
 *        (184,586 parameters)
 *
 * Both match the PyTorch definitions in tests/golden/gen.py layer for layer,
 * including the state_dict names of their tensors. Inputs are 1x28x28 images
 * (the MLP reads them as 784 features), outputs 10 logits.
 *
 * A function with a `char *err` argument writes what went wrong there: a
 * buffer of MG_ERRMSG_LEN bytes (mg_err.h). */
#ifndef MG_MODELS_H
#define MG_MODELS_H

#include "mg_err.h"
#include "model.h"

#define MG_MLP_MAX_HIDDEN 8
#define MG_MODEL_INPUT_C  1
#define MG_MODEL_INPUT_H  28
#define MG_MODEL_INPUT_W  28
#define MG_MODEL_CLASSES  10

struct mg_model_options {
    int hidden[MG_MLP_MAX_HIDDEN]; /* mlp hidden sizes; nhidden == 0 means {256} */
    int nhidden;
    float dropout; /* mlp: Dropout(p) after each hidden ReLU; 0 (default) adds none */
};

/* Builds model `name` ("mlp" or "cnn") for batches up to max_batch.
 * Returns -ENOENT for an unknown name, or mg_model_init()'s errors. */
int mg_model_create(struct mg_model *m, struct mg_backend *be, const char *name,
                    const struct mg_model_options *opt, int max_batch, char *err);

/* "mlp, cnn": for help and error messages. */
const char *mg_model_names(void);

#endif
