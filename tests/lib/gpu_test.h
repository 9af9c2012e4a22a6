/* What the CUDA tests share: where the plugin of the build under test is
 * (MG_CUDA_PLUGIN, unless already set: the unit tests live in
 * build/tests/unit/, not next to build/lib/), and the one reason a test that
 * needs the plugin or a GPU gives for skipping. */
#ifndef MG_GPU_TEST_H
#define MG_GPU_TEST_H

#include "backend.h"
#include "gpu_plugin.h"
#include "tap.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
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

/* The driver probe, run in a child process: CUDA does not survive fork(), so
 * a test that forks ranks must not start it in the parent. Returns the
 * probe's code; *devices gets how many devices the driver shows. */
static inline int gpu_test_probe(int device, int *devices, char *why, size_t len)
{
    struct {
        int rc, devices;
        char why[MG_ERRMSG_LEN];
    } r = {-EIO, 0, "the probe's process failed"};
    int fds[2];
    if (pipe(fds) != 0)
        BAIL_OUT("pipe");
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0)
        BAIL_OUT("fork");
    if (pid == 0) {
        struct mg_gpu_info info;
        close(fds[0]);
        r.rc = mg_gpu_probe(device, &info, r.why, sizeof(r.why));
        r.devices = r.rc == 0 ? info.devices : 0;
        _exit(write(fds[1], &r, sizeof(r)) == (ssize_t)sizeof(r) ? 0 : 1);
    }
    close(fds[1]);
    size_t got = 0;
    ssize_t k;
    while (got < sizeof(r) && (k = read(fds[0], (char *)&r + got, sizeof(r) - got)) > 0)
        got += (size_t)k;
    close(fds[0]);
    waitpid(pid, NULL, 0);
    if (devices)
        *devices = r.devices;
    snprintf(why, len, "%s", r.why);
    return r.rc;
}

/* Skips unless CUDA device `device` is usable: the driver probe (in a
 * child), then the plugin. "1..0 # SKIP no CUDA device (no NVIDIA driver
 * (...))". Returns how many devices the driver shows. */
static inline int gpu_test_device_or_skip(int device)
{
    char why[MG_ERRMSG_LEN];
    int devices = 0;
    gpu_test_plugin_env();
    if (gpu_test_probe(device, &devices, why, sizeof(why)) < 0)
        skip_all("no CUDA device (%s)", why);
    gpu_test_plugin_or_skip();
    return devices;
}

#endif
