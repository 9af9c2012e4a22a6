/* Tensor views. A tensor does not own memory: its data points into one of the
 * model's flat buffers (parameters, gradients, optimizer state), at `offset`
 * elements from the start (llm.c's layout). */
#ifndef MG_TENSOR_H
#define MG_TENSOR_H

#include <stddef.h>

#define MG_MAX_DIMS 4
#define MG_NAME_MAX 32

struct mg_tensor {
    char name[MG_NAME_MAX]; /* PyTorch state_dict name, e.g. "0.weight" */
    int ndim;
    int shape[MG_MAX_DIMS];
    size_t numel;
    size_t offset; /* in elements, within the flat buffer */
    float *data;   /* device pointer: flat buffer + offset */
};

/* Writes "[256, 784]" into buf. */
void mg_tensor_shape_str(const struct mg_tensor *t, char *buf, size_t len);

#endif
