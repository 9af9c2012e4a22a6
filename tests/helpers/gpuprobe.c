/* Asks libmg what it knows about GPUs, one question per run, so that
 * tests/integration/cuda_probe.t can vary the environment (LD_LIBRARY_PATH to
 * a stand-in driver, MG_CUDA_PLUGIN, CUDA_VISIBLE_DEVICES) between questions:
 *
 *   gpuprobe probe [N]     mg_gpu_probe: "usable: <banner>", or the reason
 *   gpuprobe count         how many CUDA devices the driver shows (0 without a driver)
 *   gpuprobe auto [N]      mg_device_auto: "cuda" or "cpu: <reason>", then whether
 *                          the CUDA libraries got loaded ("cuBLAS loaded: no")
 *   gpuprobe path          mg_gpu_plugin_path
 *   gpuprobe open [PATH]   mg_gpu_plugin_open (default: mg_gpu_plugin_path)
 *   gpuprobe backend [N]   mg_backend_open(MG_DEVICE_CUDA): the backend's name or the reason
 *   gpuprobe plugin-backend [N]  the plugin's own backend_create, without the probe
 *
 * Prints one line ending with the code's name ("(code: -ENXIO)"); exits 0 on
 * success, else 1. */
#include "backend.h"
#include "gpu_plugin.h"
#include "mg_err.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *code_name(int rc)
{
    switch (rc) {
    case 0:
        return "0";
    case -ENOENT:
        return "-ENOENT";
    case -ENXIO:
        return "-ENXIO";
    case -ENODEV:
        return "-ENODEV";
    case -MG_EFORMAT:
        return "-MG_EFORMAT";
    case -MG_EVERSION:
        return "-MG_EVERSION";
    case -MG_EUNSUPPORTED:
        return "-MG_EUNSUPPORTED";
    default:
        return "other";
    }
}

static int report(int rc, const char *text)
{
    printf("%s (code: %s)\n", text, code_name(rc));
    return rc ? 1 : 0;
}

/* Whether a CUDA math library is mapped into this process. */
static int cuda_libs_loaded(void)
{
    char line[512];
    int found = 0;
    FILE *fp = fopen("/proc/self/maps", "r");
    if (!fp)
        return -1;
    while (fgets(line, sizeof(line), fp))
        if (strstr(line, "libcublas") || strstr(line, "libcudnn") || strstr(line, "libmg_cuda"))
            found = 1;
    fclose(fp);
    return found;
}

int main(int argc, char **argv)
{
    char msg[MG_ERRMSG_LEN], path[PATH_MAX];
    const char *cmd = argc > 1 ? argv[1] : "";
    int idx = argc > 2 ? atoi(argv[2]) : 0, rc;
    const struct mg_gpu_plugin *p;
    struct mg_gpu_info info;
    struct mg_backend *be;

    if (!strcmp(cmd, "probe")) {
        rc = mg_gpu_probe(idx, &info, msg, sizeof(msg));
        if (rc == 0) {
            char banner[MG_ERRMSG_LEN - 16];
            mg_gpu_info_format(&info, banner, sizeof(banner));
            snprintf(msg, sizeof(msg), "usable: %s", banner);
        }
        return report(rc, msg);
    }
    if (!strcmp(cmd, "count")) {
        printf("%d\n", mg_gpu_probe(0, &info, msg, sizeof(msg)) == 0 ? info.devices : 0);
        return 0;
    }
    if (!strcmp(cmd, "auto")) {
        enum mg_device d = mg_device_auto(idx, msg, sizeof(msg));
        printf("%s%s%s\n", d == MG_DEVICE_CUDA ? "cuda" : "cpu", msg[0] ? ": " : "", msg);
        printf("cuBLAS loaded: %s\n", cuda_libs_loaded() ? "yes" : "no");
        return 0;
    }
    if (!strcmp(cmd, "path")) {
        rc = mg_gpu_plugin_path(path, sizeof(path));
        return report(rc, rc ? mg_strerror(rc) : path);
    }
    if (!strcmp(cmd, "open")) {
        if (argc > 2)
            snprintf(path, sizeof(path), "%s", argv[2]);
        else if ((rc = mg_gpu_plugin_path(path, sizeof(path))) < 0)
            return report(rc, mg_strerror(rc));
        rc = mg_gpu_plugin_open(path, &p, msg, sizeof(msg));
        if (rc == 0)
            snprintf(msg, sizeof(msg), "ok: %s", p->build);
        return report(rc, msg);
    }
    if (!strcmp(cmd, "backend")) {
        struct mg_backend_opts o = {.device_index = idx};
        rc = mg_backend_open(MG_DEVICE_CUDA, &o, &be, msg, sizeof(msg));
        if (rc == 0) {
            snprintf(msg, sizeof(msg), "ok: %s", be->name);
            mg_backend_release(be);
        }
        return report(rc, msg);
    }
    if (!strcmp(cmd, "plugin-backend")) {
        struct mg_backend_opts o = {.device_index = idx};
        rc = mg_gpu_plugin_get(&p, msg, sizeof(msg));
        if (rc == 0)
            rc = p->backend_create(&o, &be, msg, sizeof(msg));
        if (rc == 0) {
            snprintf(msg, sizeof(msg), "ok: %s", be->name);
            mg_backend_release(be);
        }
        return report(rc, msg);
    }
    fprintf(stderr, "usage: gpuprobe probe|auto|path|open|backend|plugin-backend [ARG]\n");
    return 2;
}
