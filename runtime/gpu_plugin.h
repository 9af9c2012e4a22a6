/* The CUDA plugin's interface: what libmg_cuda.so (built from runtime/cuda/)
 * gives libmg, and what libmg lends it. Plain C and no CUDA type, so libmg's
 * loader (gpu_plugin.c, always built) and the plugin both include it.
 *
 * The plugin exports one function, MG_GPU_PLUGIN_SYMBOL, which returns its
 * table. The table starts with the ABI number and its own size: a plugin from
 * another build of mg is refused by the loader, never called. The plugin links
 * only the CUDA libraries (it is linked with --no-undefined); the little of
 * libmg it needs (the store client, for the NCCL id and for naming a failed
 * rank) comes through struct mg_gpu_host, handed over once by init(). */
#ifndef MG_GPU_PLUGIN_H
#define MG_GPU_PLUGIN_H

#include "backend.h"
#include "comm.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* Changes whenever a struct the plugin and libmg share changes: the tables
 * below, struct mg_backend, struct mg_comm and their options. */
#define MG_GPU_PLUGIN_ABI    4
#define MG_GPU_PLUGIN_SYMBOL "mg_gpu_plugin_v1"
#define MG_GPU_PLUGIN_FILE   "libmg_cuda.so"
#define MG_NCCL_ID_BYTES     128 /* sizeof(ncclUniqueId) */

struct mg_store;

/* libmg's functions the plugin calls (the store client of store.h). */
struct mg_gpu_host {
    uint32_t abi, size;
    int (*store_set)(struct mg_store *st, const char *key, const void *val, size_t len, int flags);
    int (*store_get)(struct mg_store *st, const char *key, void **val, size_t *len, int timeout_ms);
    int (*store_list)(struct mg_store *st, const char *prefix, int max, char ***keys, int *nkeys);
    void (*store_free_list)(char **keys, int nkeys);
    const char *(*strerror)(int err);
};

struct mg_gpu_plugin {
    uint32_t abi, size;
    /* what it was compiled against, e.g. "CUDA 13.0, cuBLAS 13.1.0, cuDNN 9.19.0, NCCL 2.28.9" */
    const char *build;
    /* Called once by the loader before anything else. */
    int (*init)(const struct mg_gpu_host *host);
    /* mg_backend_open(MG_DEVICE_CUDA) and mg_comm_nccl_create, once the loader
     * found the plugin: a negative code and a one-line message in err. */
    int (*backend_create)(const struct mg_backend_opts *opts, struct mg_backend **out, char *err,
                          size_t errlen);
    int (*comm_create)(struct mg_comm **out, struct mg_store *store,
                       const struct mg_comm_opts *opts, char *err, size_t errlen);
    /* The device and every library version, for the banner (needs a driver). */
    int (*info)(int device_index, struct mg_gpu_info *info, char *err, size_t errlen);
    /* cuDNN's own shape arithmetic (host-only, no GPU needed): the N, C, H, W of
     * a convolution's and a max-pool's output, or cuDNN's refusal. */
    int (*conv2d_out_dims)(const struct mg_conv2d_dims *d, int out[4], char *err, size_t errlen);
    int (*pool2d_out_dims)(const struct mg_pool2d_dims *d, int out[4], char *err, size_t errlen);
    /* The first step of comm_create, alone: rank 0 makes the NCCL unique id and
     * publishes it in the store under the key of opts' run and restart; the
     * other ranks wait for it (opts->init_timeout_ms). No GPU needed. */
    int (*nccl_exchange_id)(struct mg_store *store, const struct mg_comm_opts *opts,
                            unsigned char id[MG_NCCL_ID_BYTES], char *err, size_t errlen);
};

/* mg_gpu_info_format's text; inline, so the plugin names its backend with it. */
static inline void mg_gpu_info_text(const struct mg_gpu_info *in, char *buf, size_t len)
{
    size_t at = 0;
#define MG_GPU_APPEND(...)                                                                         \
    do {                                                                                           \
        if (at < len) {                                                                            \
            int n_ = snprintf(buf + at, len - at, __VA_ARGS__);                                    \
            at += n_ > 0 ? (size_t)n_ : 0;                                                         \
        }                                                                                          \
    } while (0)
    if (len)
        buf[0] = '\0';
    MG_GPU_APPEND("%s", in->name[0] ? in->name : "unknown GPU");
    if (in->memory || in->cc_major)
        MG_GPU_APPEND(" (%.1f GiB, sm_%d%d)", (double)in->memory / (1u << 30), in->cc_major,
                      in->cc_minor);
    if (in->driver[0] && in->driver_cuda)
        MG_GPU_APPEND("; driver %s (CUDA %d.%d)", in->driver, in->driver_cuda / 1000,
                      in->driver_cuda % 1000 / 10);
    else if (in->driver_cuda)
        MG_GPU_APPEND("; driver for CUDA %d.%d", in->driver_cuda / 1000,
                      in->driver_cuda % 1000 / 10);
    if (in->runtime)
        MG_GPU_APPEND(", runtime %d.%d", in->runtime / 1000, in->runtime % 1000 / 10);
    if (in->cublas)
        MG_GPU_APPEND(", cuBLAS %d.%d.%d", in->cublas / 10000, in->cublas / 100 % 100,
                      in->cublas % 100);
    if (in->cudnn)
        MG_GPU_APPEND(", cuDNN %d.%d.%d", in->cudnn / 10000, in->cudnn / 100 % 100,
                      in->cudnn % 100);
    if (in->nccl)
        MG_GPU_APPEND(", NCCL %d.%d.%d", in->nccl / 10000, in->nccl / 100 % 100, in->nccl % 100);
#undef MG_GPU_APPEND
}

/* The NVIDIA kernel module's version, from /proc/driver/nvidia/version
 * ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  ..."), or "". */
static inline void mg_nvidia_driver_version(char *buf, size_t len)
{
    char line[256];
    buf[0] = '\0';
    FILE *fp = fopen("/proc/driver/nvidia/version", "re");
    if (!fp)
        return;
    if (fgets(line, sizeof(line), fp)) {
        const char *p = strstr(line, "Module");
        for (p = p ? p : line; *p; p++) {
            size_t n = strspn(p, "0123456789.");
            if (n && n < len && memchr(p, '.', n)) {
                memcpy(buf, p, n);
                buf[n] = '\0';
                break;
            }
            p += n ? n - 1 : 0;
        }
    }
    fclose(fp);
}

/* The plugin's one export. */
const struct mg_gpu_plugin *mg_gpu_plugin_v1(void);

/* ---- libmg's loader (gpu_plugin.c) -------------------------------------------------- */

/* Where the plugin is: $MG_CUDA_PLUGIN when set, else ../lib/libmg_cuda.so
 * from the directory of the running program (build/bin -> build/lib, and
 * PREFIX/bin -> PREFIX/lib once installed). */
int mg_gpu_plugin_path(char *buf, size_t len);

/* Loads the plugin at path and hands it libmg's functions: 0, or -ENOENT (no
 * such file, or a library it needs is missing: the message names it),
 * -MG_EFORMAT (not a shared library, or not an mg plugin), -MG_EVERSION (a
 * plugin from another build), with one line in err. Each call loads again:
 * for tests; everything else uses mg_gpu_plugin_get. */
int mg_gpu_plugin_open(const char *path, const struct mg_gpu_plugin **out, char *err,
                       size_t errlen);

/* The process's plugin, loaded on the first call (the result, success or
 * failure, is kept). -MG_EUNSUPPORTED when this build made none. */
int mg_gpu_plugin_get(const struct mg_gpu_plugin **out, char *err, size_t errlen);

#endif
