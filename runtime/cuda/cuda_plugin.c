/* The CUDA plugin's entry (gpu_plugin.h): its table, the functions libmg
 * lends it, the first-error latch of cuda_internal.h, and the version banner.
 * The only symbol libmg_cuda.so exports is mg_gpu_plugin_v1 (the rest is built
 * with -fvisibility=hidden). */
#include "cuda_internal.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <errno.h>
#include <nccl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const struct mg_gpu_host *mgcu_host;

int mgcu_seterr(char *err, size_t errlen, int code, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return code;
}

void mgcu_fail(struct mgcu_err *e, int code, const char *fmt, ...)
{
    if (e->code)
        return;
    e->code = code ? code : -EIO;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
    va_end(ap);
}

/* "cudaMemcpyAsync(dst, ...)" -> "cudaMemcpyAsync"; the file without its directories. */
static void where(const char *call, const char *file, char *name, size_t len, const char **base)
{
    size_t n = strcspn(call, "( ");
    snprintf(name, len, "%.*s", (int)(n < len ? n : len - 1), call);
    const char *slash = strrchr(file, '/');
    *base = slash ? slash + 1 : file;
}

int mgcu_cuda_code(cudaError_t st)
{
    switch (st) {
    case cudaErrorMemoryAllocation:
        return -ENOMEM;
    case cudaErrorNoDevice:
    case cudaErrorInvalidDevice:
    case cudaErrorDevicesUnavailable:
        return -ENODEV;
    case cudaErrorInsufficientDriver:
    case cudaErrorStubLibrary:
        return -ENXIO;
    case cudaErrorCallRequiresNewerDriver:
        return -MG_EVERSION;
    default:
        return -EIO;
    }
}

int mgcu_cuda_failed(struct mgcu_err *e, cudaError_t st, const char *call, const char *file,
                     int line)
{
    if (st == cudaSuccess)
        return 0;
    char name[64];
    const char *base;
    where(call, file, name, sizeof(name), &base);
    mgcu_fail(e, mgcu_cuda_code(st), "%s:%d: %s: %s (%s)", base, line, name, cudaGetErrorString(st),
              cudaGetErrorName(st));
    return 1;
}

int mgcu_cublas_failed(struct mgcu_err *e, cublasStatus_t st, const char *call, const char *file,
                       int line)
{
    if (st == CUBLAS_STATUS_SUCCESS)
        return 0;
    char name[64];
    const char *base;
    where(call, file, name, sizeof(name), &base);
    mgcu_fail(e, st == CUBLAS_STATUS_ALLOC_FAILED ? -ENOMEM : -EIO, "%s:%d: %s: %s (%s)", base,
              line, name, cublasGetStatusString(st), cublasGetStatusName(st));
    return 1;
}

int mgcu_cudnn_failed(struct mgcu_err *e, cudnnStatus_t st, const char *call, const char *file,
                      int line)
{
    if (st == CUDNN_STATUS_SUCCESS)
        return 0;
    char name[64], last[256] = "";
    const char *base;
    where(call, file, name, sizeof(name), &base);
    cudnnGetLastErrorString(last, sizeof(last));
    last[strcspn(last, "\n")] = '\0';
    mgcu_fail(e,
              st == CUDNN_STATUS_ALLOC_FAILED    ? -ENOMEM
              : st == CUDNN_STATUS_BAD_PARAM     ? -EINVAL
              : st == CUDNN_STATUS_NOT_SUPPORTED ? -MG_EUNSUPPORTED
                                                 : -EIO,
              "%s:%d: %s: %s%s%s", base, line, name, cudnnGetErrorString(st), last[0] ? ": " : "",
              last);
    return 1;
}

int mgcu_info(int device_index, struct mg_gpu_info *info, char *err, size_t errlen)
{
    struct cudaDeviceProp prop;
    struct mgcu_err e = {0};
    int v = 0;
    memset(info, 0, sizeof(*info));
    /* what needs no GPU first, so a failure below still leaves the versions */
    cudaRuntimeGetVersion(&info->runtime);
    cudaDriverGetVersion(&info->driver_cuda);
    info->cudnn = (int)cudnnGetVersion();
    if (ncclGetVersion(&v) == ncclSuccess)
        info->nccl = v;
    int major = 0, minor = 0, patch = 0;
    if (cublasGetProperty(MAJOR_VERSION, &major) == CUBLAS_STATUS_SUCCESS &&
        cublasGetProperty(MINOR_VERSION, &minor) == CUBLAS_STATUS_SUCCESS &&
        cublasGetProperty(PATCH_LEVEL, &patch) == CUBLAS_STATUS_SUCCESS)
        info->cublas = major * 10000 + minor * 100 + patch;
    mg_nvidia_driver_version(info->driver, sizeof(info->driver));
    if (CU_FAILED(&e, cudaGetDeviceCount(&info->devices)) ||
        CU_FAILED(&e, cudaGetDeviceProperties(&prop, device_index)))
        return mgcu_seterr(err, errlen, e.code, "%s", e.msg);
    snprintf(info->name, sizeof(info->name), "%.95s", prop.name);
    info->memory = prop.totalGlobalMem;
    info->cc_major = prop.major;
    info->cc_minor = prop.minor;
    return 0;
}

static int plugin_init(const struct mg_gpu_host *host)
{
    if (!host || host->abi != MG_GPU_PLUGIN_ABI || host->size != sizeof(*host))
        return -MG_EVERSION;
    mgcu_host = host;
    return 0;
}

static char build[128];

static const struct mg_gpu_plugin table = {
    .abi = MG_GPU_PLUGIN_ABI,
    .size = sizeof(struct mg_gpu_plugin),
    .build = build,
    .init = plugin_init,
    .backend_create = mgcu_backend_create,
    .comm_create = mgcu_comm_create,
    .info = mgcu_info,
    .conv2d_out_dims = mgcu_conv2d_out_dims,
    .pool2d_out_dims = mgcu_pool2d_out_dims,
    .nccl_exchange_id = mgcu_nccl_exchange_id,
};

__attribute__((visibility("default"))) const struct mg_gpu_plugin *mg_gpu_plugin_v1(void)
{
    if (!build[0])
        snprintf(build, sizeof(build), "CUDA %d.%d, cuBLAS %d.%d.%d, cuDNN %d.%d.%d, NCCL %d.%d.%d",
                 CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10, CUBLAS_VER_MAJOR,
                 CUBLAS_VER_MINOR, CUBLAS_VER_PATCH, CUDNN_MAJOR, CUDNN_MINOR, CUDNN_PATCHLEVEL,
                 NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
    return &table;
}
