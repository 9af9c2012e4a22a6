/* What the CUDA tests share: where the plugin of the build under test is
 * (MG_CUDA_PLUGIN, unless already set: the unit tests live in
 * build/tests/unit/, not next to build/lib/), and the one reason a test that
 * needs the plugin or a GPU gives for skipping. */
#ifndef MG_GPU_TEST_H
#define MG_GPU_TEST_H

#include "backend.h"
#include "gpu_plugin.h"
#include "tap.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Points MG_CUDA_PLUGIN at <build>/lib/libmg_cuda.so for a test program in
 * <build>/tests/unit/ or <build>/tests/helpers/. */
static inline void gpu_test_plugin_env(void)
{
    char exe[PATH_MAX], path[PATH_MAX + 32];
    if (getenv("MG_CUDA_PLUGIN"))
        return;
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0)
        return;
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash)
        *slash = '\0';
    snprintf(path, sizeof(path), "%s/../../lib/%s", exe, MG_GPU_PLUGIN_FILE);
    setenv("MG_CUDA_PLUGIN", path, 0);
}

/* The plugin, or skip_all with the reason. */
static inline const struct mg_gpu_plugin *gpu_test_plugin_or_skip(void)
{
    const struct mg_gpu_plugin *p;
    char err[MG_ERRMSG_LEN];
    gpu_test_plugin_env();
    if (mg_gpu_plugin_get(&p, err, sizeof(err)) < 0)
        skip_all("no CUDA plugin (%s)", err);
    return p;
}

/* Skips unless CUDA device `device` is usable: the driver probe, then the
 * plugin. "1..0 # SKIP no CUDA device (no NVIDIA driver (...))". */
static inline const struct mg_gpu_plugin *gpu_test_device_or_skip(int device)
{
    char why[MG_ERRMSG_LEN];
    gpu_test_plugin_env();
    if (mg_gpu_probe(device, NULL, why, sizeof(why)) < 0)
        skip_all("no CUDA device (%s)", why);
    return gpu_test_plugin_or_skip();
}

#endif
