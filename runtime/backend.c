/* Backend selection (see backend.h) and the dimension helpers shared by all backends. */
#include "backend.h"

#include <errno.h>
#include <string.h>

int mg_conv2d_dims_finish(struct mg_conv2d_dims *d)
{
    if (d->n <= 0 || d->c <= 0 || d->h <= 0 || d->w <= 0 || d->oc <= 0 || d->kh <= 0 ||
        d->kw <= 0 || d->stride <= 0 || d->pad < 0)
        return -EINVAL;
    int hp = d->h + 2 * d->pad, wp = d->w + 2 * d->pad;
    if (hp < d->kh || wp < d->kw)
        return -EINVAL;
    d->oh = (hp - d->kh) / d->stride + 1;
    d->ow = (wp - d->kw) / d->stride + 1;
    return 0;
}

int mg_pool2d_dims_finish(struct mg_pool2d_dims *d)
{
    if (d->n <= 0 || d->c <= 0 || d->h <= 0 || d->w <= 0 || d->k <= 0 || d->stride <= 0)
        return -EINVAL;
    if (d->h < d->k || d->w < d->k)
        return -EINVAL;
    d->oh = (d->h - d->k) / d->stride + 1;
    d->ow = (d->w - d->k) / d->stride + 1;
    return 0;
}

int mg_device_parse(const char *s, enum mg_device *out)
{
    if (!strcmp(s, "cpu"))
        *out = MG_DEVICE_CPU;
    else if (!strcmp(s, "cuda"))
        *out = MG_DEVICE_CUDA;
    else
        return -EINVAL;
    return 0;
}

int mg_device_available(enum mg_device dev)
{
    return dev == MG_DEVICE_CPU || (dev == MG_DEVICE_CUDA && MG_HAVE_CUDA);
}

int mg_backend_create(enum mg_device dev, const struct mg_backend_opts *opts,
                      struct mg_backend **out)
{
    static const struct mg_backend_opts defaults;
    if (!opts)
        opts = &defaults;
    switch (dev) {
    case MG_DEVICE_CPU:
        return mg_cpu_backend_create(opts, out);
    case MG_DEVICE_CUDA:
        return mg_cuda_backend_create(opts, out);
    }
    return -EINVAL;
}

void mg_backend_release(struct mg_backend *be)
{
    if (be)
        be->ops->release(be);
}
