/* Tensor views (see tensor.h): their shapes as text, for messages. */
#include "tensor.h"

#include <stdio.h>

void mg_tensor_shape_str(const struct mg_tensor *t, char *buf, size_t len)
{
    size_t off = 0;
    off += (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < t->ndim && off < len; i++)
        off += (size_t)snprintf(buf + off, len - off, i ? ", %d" : "%d", t->shape[i]);
    if (off < len)
        snprintf(buf + off, len - off, "]");
}
