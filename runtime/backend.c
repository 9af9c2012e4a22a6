/* Backend selection (see backend.h), the dimension helpers shared by all
 * backends, and what stands in for the optional overlap ops. */
#include "backend.h"
#include "gpu_plugin.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
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

int mg_backend_open(enum mg_device dev, const struct mg_backend_opts *opts, struct mg_backend **out,
                    char *err, size_t errlen)
{
    static const struct mg_backend_opts defaults;
    if (!opts)
        opts = &defaults;
    switch (dev) {
    case MG_DEVICE_CPU:
        return mg_cpu_backend_create(opts, out, err, errlen);
    case MG_DEVICE_CUDA:
        return mg_cuda_backend_create(opts, out, err, errlen);
    }
    return mg_seterr(err, errlen, -EINVAL, "unknown device %d", (int)dev);
}

int mg_backend_create(enum mg_device dev, const struct mg_backend_opts *opts,
                      struct mg_backend **out)
{
    return mg_backend_open(dev, opts, out, NULL, 0);
}

void *mg_backend_host_alloc(struct mg_backend *be, size_t bytes)
{
    if (be->ops->host_alloc)
        return be->ops->host_alloc(be, bytes);
    void *p = NULL;
    return posix_memalign(&p, 64, bytes ? (bytes + 63) & ~(size_t)63 : 64) ? NULL : p;
}

void mg_backend_host_free(struct mg_backend *be, void *p)
{
    if (be->ops->host_free)
        be->ops->host_free(be, p);
    else
        free(p);
}

uint64_t mg_backend_upload_async(struct mg_backend *be, void *dst, const void *host_src,
                                 size_t bytes)
{
    if (be->ops->upload_async)
        return be->ops->upload_async(be, dst, host_src, bytes);
    be->ops->upload(be, dst, host_src, bytes);
    return 1;
}

void mg_backend_upload_wait(struct mg_backend *be, uint64_t ticket)
{
    if (be->ops->upload_wait)
        be->ops->upload_wait(be, ticket);
}

int mg_backend_upload_done(struct mg_backend *be, uint64_t ticket, int wait)
{
    return be->ops->upload_done ? be->ops->upload_done(be, ticket, wait) : 1;
}

void *mg_backend_event_record(struct mg_backend *be)
{
    return be->ops->event_record ? be->ops->event_record(be) : NULL;
}

void mg_backend_event_release(struct mg_backend *be, void *event)
{
    if (event && be->ops->event_release)
        be->ops->event_release(be, event);
}

void mg_backend_upload_after(struct mg_backend *be, void *event)
{
    if (event && be->ops->upload_after)
        be->ops->upload_after(be, event);
}

int mg_backend_poll(struct mg_backend *be)
{
    return be->ops->poll ? be->ops->poll(be) : 0;
}

const char *mg_backend_errmsg(struct mg_backend *be)
{
    return be->ops->errmsg ? be->ops->errmsg(be) : "";
}

void mg_gpu_info_format(const struct mg_gpu_info *info, char *buf, size_t len)
{
    mg_gpu_info_text(info, buf, len);
}

void mg_backend_release(struct mg_backend *be)
{
    if (be)
        be->ops->release(be);
}
