/* libmg's side of the CUDA plugin (gpu_plugin.h): finding and loading
 * libmg_cuda.so, the cheap "is a GPU usable" probe behind --device auto, and
 * the two entry points the rest of libmg calls (mg_cuda_backend_create,
 * mg_comm_nccl_create). Plain C with no CUDA header: it is in every build,
 * and a build without the plugin answers with a clear error.
 *
 * The probe talks to the driver alone (libcuda.so.1, through dlopen, with the
 * few prototypes below): loading the plugin would load cuBLAS and cuDNN, half
 * a gigabyte, only to learn that there is no GPU. */
#include "backend.h"
#include "comm.h"
#include "gpu_plugin.h"
#include "mg_err.h"
#include "store.h"

#include <dlfcn.h>
#include <errno.h>
#include <glob.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- loading the plugin ------------------------------------------------------------- */

static const struct mg_gpu_host host_api = {
    .abi = MG_GPU_PLUGIN_ABI,
    .size = sizeof(struct mg_gpu_host),
    .store_set = mg_store_set,
    .store_get = mg_store_get,
    .store_list = mg_store_list,
    .store_free_list = mg_store_free_list,
    .strerror = mg_strerror,
};

int mg_gpu_plugin_path(char *buf, size_t len)
{
    const char *env = getenv("MG_CUDA_PLUGIN");
    if (env && *env)
        return mg_fmt(buf, len, "%s", env) < 0 ? -ENAMETOOLONG : 0;
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0)
        return -errno;
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash)
        *slash = '\0';
    return mg_fmt(buf, len, "%s/../lib/%s", exe, MG_GPU_PLUGIN_FILE) < 0 ? -ENAMETOOLONG : 0;
}

/* dlopen's message for a dependency it cannot find starts with that
 * dependency's name: "libcublas.so.13: cannot open shared object file: ...". */
static int names_missing_library(const char *msg, const char *path)
{
    const char *tail = strstr(msg, ": cannot open shared object file");
    if (!tail)
        return 0;
    size_t plen = strlen(path);
    return !((size_t)(tail - msg) == plen && !strncmp(msg, path, plen));
}

/* ---- the CUDA libraries: the plugin's run path, the system's, or PyTorch's pip wheels ---- */

/* Where pip puts NVIDIA's wheels: <site-packages>/nvidia/<package>/lib/<soname>, with
 * <package> cudnn, nccl, cu13 (CUDA 13's runtime and cuBLAS) or cublas and cuda_runtime
 * (CUDA 12's). These are the site-packages of the Pythons a user is likely to have run
 * `pip install torch` with: the active virtual environment or conda environment, every
 * python3 on PATH, PYTHONPATH, the user's own and the system's. Each entry is a glob(3)
 * pattern of directories. */
#define WHEEL_DIRS_MAX 48
struct wheel_dirs {
    int n;
    char dir[WHEEL_DIRS_MAX][PATH_MAX];
};

static void wheel_add(struct wheel_dirs *w, const char *a, const char *tail)
{
    if (w->n < WHEEL_DIRS_MAX && a && *a && mg_fmt(w->dir[w->n], PATH_MAX, "%s%s", a, tail) >= 0)
        w->n++;
}

static void wheel_add_prefix(struct wheel_dirs *w, const char *prefix)
{
    wheel_add(w, prefix, "/lib/python3*/site-packages");
    wheel_add(w, prefix, "/lib/python3*/dist-packages");
}

static void wheel_dirs_find(struct wheel_dirs *w)
{
    char buf[PATH_MAX];
    w->n = 0;
    wheel_add_prefix(w, getenv("VIRTUAL_ENV"));
    wheel_add_prefix(w, getenv("CONDA_PREFIX"));
    const char *lists[2] = {getenv("PATH"), getenv("PYTHONPATH")};
    for (int l = 0; l < 2; l++) {
        for (const char *s = lists[l]; s && *s;) {
            size_t n = strcspn(s, ":");
            if (n > 0 && n < sizeof(buf) - 16) {
                memcpy(buf, s, n);
                buf[n] = '\0';
                if (l == 1) {
                    wheel_add(w, buf, ""); /* a PYTHONPATH entry is itself searched */
                } else {
                    /* <prefix>/bin/python3: <prefix>/lib/python3.X/site-packages */
                    size_t at = n;
                    memcpy(buf + at, "/python3", 9);
                    if (access(buf, X_OK) == 0) {
                        buf[at] = '\0';
                        char *slash = strrchr(buf, '/');
                        if (slash && slash != buf) {
                            *slash = '\0';
                            wheel_add_prefix(w, buf);
                        }
                    }
                }
            }
            s += n + (s[n] == ':');
        }
    }
    const char *home = getenv("HOME");
    if (home && *home && mg_fmt(buf, sizeof(buf), "%s/.local", home) >= 0)
        wheel_add_prefix(w, buf);
    wheel_add_prefix(w, "/usr/local");
    wheel_add_prefix(w, "/usr");
    wheel_add(w, "/usr/lib/python3/dist-packages", "");
}

/* Loads each library the plugin needs (MG_CUDA_LIBS, in load order) that the loader cannot
 * find by itself, from the wheels; its soname then satisfies the plugin's NEEDED entry. On
 * return, missing lists those found nowhere (", "-separated), and why says why a file that
 * was found did not load. Returns how many are missing. */
static int cuda_libs_preload(char *missing, size_t mlen, char *why, size_t wlen, int *nsites)
{
    char libs[] = MG_CUDA_LIBS;
    struct wheel_dirs *w = malloc(sizeof(*w));
    int nmissing = 0;
    size_t mat = 0;
    missing[0] = why[0] = '\0';
    *nsites = 0;
    if (!w)
        return 0;
    wheel_dirs_find(w);
    char *save = NULL;
    for (char *lib = strtok_r(libs, " ", &save); lib; lib = strtok_r(NULL, " ", &save)) {
        if (dlopen(lib, RTLD_NOW | RTLD_LOCAL))
            continue; /* LD_LIBRARY_PATH, ldconfig's cache, the system's directories */
        int loaded = 0;
        for (int i = 0; i < w->n && !loaded; i++) {
            char pat[PATH_MAX];
            glob_t g;
            if (mg_fmt(pat, sizeof(pat), "%s/nvidia/*/lib/%s", w->dir[i], lib) < 0)
                continue;
            if (glob(pat, 0, NULL, &g) != 0)
                continue;
            for (size_t k = 0; k < g.gl_pathc && !loaded; k++) {
                if (dlopen(g.gl_pathv[k], RTLD_NOW | RTLD_LOCAL)) {
                    loaded = 1;
                } else if (!why[0]) {
                    const char *e = dlerror();
                    snprintf(why, wlen, "; %s: %s", g.gl_pathv[k], e ? e : "cannot be loaded");
                }
            }
            globfree(&g);
        }
        if (!loaded) {
            int n = snprintf(missing + mat, mlen - mat, "%s%s", nmissing ? ", " : "", lib);
            mat += n > 0 && (size_t)n < mlen - mat ? (size_t)n : 0;
            nmissing++;
        }
    }
    /* how many site-packages directories exist, for the message */
    for (int i = 0; i < w->n; i++) {
        glob_t g;
        if (glob(w->dir[i], GLOB_ONLYDIR, NULL, &g) == 0) {
            *nsites += (int)g.gl_pathc;
            globfree(&g);
        }
    }
    free(w);
    return nmissing;
}

int mg_gpu_plugin_open(const char *path, const struct mg_gpu_plugin **out, char *err, size_t errlen)
{
    *out = NULL;
    if (access(path, F_OK) != 0)
        return mg_seterr(err, errlen, -ENOENT,
                         "the CUDA plugin %s is missing (set MG_CUDA_PLUGIN to where it is)", path);
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *msg = dlerror();
        char first[MG_ERRMSG_LEN];
        snprintf(first, sizeof(first), "%s", msg ? msg : "unknown error");
        if (!names_missing_library(first, path))
            return mg_seterr(err, errlen, -MG_EFORMAT,
                             "the CUDA plugin %s cannot be loaded: %s (not a shared library?)",
                             path, first);
        /* Its run path (where the build found the libraries) does not have them here: look
         * where PyTorch's pip wheels put them, as PyTorch does, and try again. */
        char missing[160], why[MG_ERRMSG_LEN / 2];
        int nsites;
        if (cuda_libs_preload(missing, sizeof(missing), why, sizeof(why), &nsites) > 0)
            return mg_seterr(err, errlen, -ENOENT,
                             "the CUDA plugin %s needs libraries this machine lacks: %s (looked on "
                             "LD_LIBRARY_PATH, in the system's libraries, the plugin's run path "
                             "and the nvidia/*/lib of pip wheels in %d Python site-packages%s; "
                             "PyTorch's CUDA wheels bring them (pip install torch), or add their "
                             "directory to LD_LIBRARY_PATH)",
                             path, missing, nsites, why);
        h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            msg = dlerror();
            return mg_seterr(err, errlen, -ENOENT,
                             "the CUDA plugin %s needs a library this machine lacks: %s "
                             "(install the CUDA 13, cuDNN 9 and NCCL 2 libraries, or add their "
                             "directory to LD_LIBRARY_PATH)",
                             path, msg ? msg : first);
        }
    }
    const struct mg_gpu_plugin *(*entry)(void);
    *(void **)&entry = dlsym(h, MG_GPU_PLUGIN_SYMBOL);
    if (!entry) {
        dlclose(h);
        return mg_seterr(err, errlen, -MG_EFORMAT,
                         "%s is not an mg CUDA plugin: it has no %s function", path,
                         MG_GPU_PLUGIN_SYMBOL);
    }
    const struct mg_gpu_plugin *p = entry();
    if (!p || p->abi != MG_GPU_PLUGIN_ABI || p->size != sizeof(struct mg_gpu_plugin)) {
        unsigned abi = p ? p->abi : 0;
        dlclose(h);
        return mg_seterr(err, errlen, -MG_EVERSION,
                         "the CUDA plugin %s is from another build of mg (plugin interface %u, "
                         "this program's is %d)",
                         path, abi, MG_GPU_PLUGIN_ABI);
    }
    int rc = p->init(&host_api);
    if (rc < 0) {
        /* the plugin may have started threads (CUDA's): it stays loaded */
        return mg_seterr(err, errlen, rc, "the CUDA plugin %s failed to start: %s", path,
                         mg_strerror(rc));
    }
    *out = p;
    return 0;
}

static pthread_once_t plugin_once = PTHREAD_ONCE_INIT;
static const struct mg_gpu_plugin *plugin;
static int plugin_rc;
static char plugin_err[MG_ERRMSG_LEN];

static void plugin_load(void)
{
    char path[PATH_MAX];
    if (!MG_HAVE_CUDA) {
        plugin_rc = mg_seterr(plugin_err, sizeof(plugin_err), -MG_EUNSUPPORTED,
                              "this build of mg has no CUDA plugin (it was built without nvcc, "
                              "cuDNN and NCCL; see docs/gpu.md)");
        return;
    }
    plugin_rc = mg_gpu_plugin_path(path, sizeof(path));
    if (plugin_rc < 0) {
        mg_seterr(plugin_err, sizeof(plugin_err), plugin_rc, "cannot find the CUDA plugin: %s",
                  mg_strerror(plugin_rc));
        return;
    }
    plugin_rc = mg_gpu_plugin_open(path, &plugin, plugin_err, sizeof(plugin_err));
}

int mg_gpu_plugin_get(const struct mg_gpu_plugin **out, char *err, size_t errlen)
{
    pthread_once(&plugin_once, plugin_load);
    *out = plugin;
    if (plugin_rc < 0)
        return mg_seterr(err, errlen, plugin_rc, "%s", plugin_err);
    return 0;
}

/* ---- the driver probe ----------------------------------------------------------------- */

/* The driver API calls the probe makes (cuda.h, which this file must not include). */
struct driver_api {
    int (*init)(unsigned flags);
    int (*driver_version)(int *version);
    int (*device_count)(int *count);
    int (*device_get)(int *dev, int ordinal);
    int (*device_name)(char *name, int len, int dev);
    int (*device_memory)(size_t *bytes, int dev);
    int (*device_attribute)(int *value, int attribute, int dev);
    int (*error_name)(int err, const char **name);
    int (*error_string)(int err, const char **text);
};

#define CUDA_ERROR_NO_DEVICE      100
#define CU_ATTR_COMPUTE_CAP_MAJOR 75
#define CU_ATTR_COMPUTE_CAP_MINOR 76

static pthread_once_t probe_once = PTHREAD_ONCE_INIT;
static struct driver_api drv;
static int probe_rc;
static char probe_err[MG_ERRMSG_LEN];
static int probe_count, probe_driver_cuda;
static char probe_driver[32];

/* ", CUDA_VISIBLE_DEVICES='...'" when it is set: it is often why there is no device. */
static void visible_note(char *buf, size_t len)
{
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    if (v)
        snprintf(buf, len, " (CUDA_VISIBLE_DEVICES='%.64s')", v);
    else
        buf[0] = '\0';
}

static void cu_error(int rc, const char **name, const char **text)
{
    *name = *text = NULL;
    if (drv.error_name)
        drv.error_name(rc, name);
    if (drv.error_string)
        drv.error_string(rc, text);
    *name = *name ? *name : "unknown";
    *text = *text ? *text : "unknown error";
}

static void probe_load(void)
{
    char note[96];
    const char *name, *text;
    visible_note(note, sizeof(note));
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *msg = dlerror();
        probe_rc = mg_seterr(probe_err, sizeof(probe_err), -ENXIO, "no NVIDIA driver (%s)",
                             msg ? msg : "libcuda.so.1 cannot be loaded");
        return;
    }
    static const struct {
        const char *sym;
        size_t off;
    } syms[] = {
        {"cuInit", offsetof(struct driver_api, init)},
        {"cuDriverGetVersion", offsetof(struct driver_api, driver_version)},
        {"cuDeviceGetCount", offsetof(struct driver_api, device_count)},
        {"cuDeviceGet", offsetof(struct driver_api, device_get)},
        {"cuDeviceGetName", offsetof(struct driver_api, device_name)},
        {"cuDeviceTotalMem_v2", offsetof(struct driver_api, device_memory)},
        {"cuDeviceGetAttribute", offsetof(struct driver_api, device_attribute)},
        {"cuGetErrorName", offsetof(struct driver_api, error_name)},
        {"cuGetErrorString", offsetof(struct driver_api, error_string)},
    };
    for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
        void *f = dlsym(h, syms[i].sym);
        if (!f) {
            probe_rc = mg_seterr(probe_err, sizeof(probe_err), -ENXIO,
                                 "no usable NVIDIA driver: libcuda.so.1 has no %s", syms[i].sym);
            return; /* h stays loaded: a driver library may have started threads */
        }
        memcpy((char *)&drv + syms[i].off, &f, sizeof(f));
    }
    mg_nvidia_driver_version(probe_driver, sizeof(probe_driver));
    int rc = drv.init(0);
    if (rc == CUDA_ERROR_NO_DEVICE) {
        cu_error(rc, &name, &text);
        probe_rc = mg_seterr(probe_err, sizeof(probe_err), -ENODEV,
                             "no CUDA device: cuInit: %s (%s)%s", text, name, note);
        return;
    }
    if (rc != 0) {
        cu_error(rc, &name, &text);
        probe_rc = mg_seterr(probe_err, sizeof(probe_err), -ENXIO,
                             "the NVIDIA driver%s%s does not start: cuInit: %s (%s)",
                             probe_driver[0] ? " " : "", probe_driver, text, name);
        return;
    }
    if (drv.driver_version(&probe_driver_cuda) != 0)
        probe_driver_cuda = 0;
    if (MG_CUDA_VERSION && probe_driver_cuda && probe_driver_cuda < MG_CUDA_VERSION) {
        probe_rc = mg_seterr(
            probe_err, sizeof(probe_err), -MG_EVERSION,
            "the NVIDIA driver%s%s supports CUDA %d.%d, and this build of mg needs CUDA %d.%d "
            "(a newer driver; see docs/gpu.md)",
            probe_driver[0] ? " " : "", probe_driver, probe_driver_cuda / 1000,
            probe_driver_cuda % 1000 / 10, MG_CUDA_VERSION / 1000, MG_CUDA_VERSION % 1000 / 10);
        return;
    }
    rc = drv.device_count(&probe_count);
    if (rc != 0) {
        cu_error(rc, &name, &text);
        probe_rc = mg_seterr(probe_err, sizeof(probe_err), -ENODEV,
                             "no CUDA device: cuDeviceGetCount: %s (%s)%s", text, name, note);
        return;
    }
    if (probe_count <= 0)
        probe_rc = mg_seterr(probe_err, sizeof(probe_err), -ENODEV,
                             "no CUDA device: the driver shows none%s", note);
}

int mg_gpu_probe(int device_index, struct mg_gpu_info *info, char *why, size_t len)
{
    char note[96];
    pthread_once(&probe_once, probe_load);
    if (info)
        memset(info, 0, sizeof(*info));
    if (probe_rc < 0)
        return mg_seterr(why, len, probe_rc, "%s", probe_err);
    if (device_index < 0 || device_index >= probe_count) {
        visible_note(note, sizeof(note));
        return mg_seterr(why, len, -ENODEV, "no CUDA device %d: the driver shows %d%s",
                         device_index, probe_count, note);
    }
    if (info) {
        int dev = device_index;
        info->devices = probe_count;
        info->driver_cuda = probe_driver_cuda;
        snprintf(info->driver, sizeof(info->driver), "%s", probe_driver);
        if (drv.device_get(&dev, device_index) == 0) {
            if (drv.device_name(info->name, (int)sizeof(info->name), dev) != 0)
                info->name[0] = '\0';
            if (drv.device_memory(&info->memory, dev) != 0)
                info->memory = 0;
            if (drv.device_attribute(&info->cc_major, CU_ATTR_COMPUTE_CAP_MAJOR, dev) != 0 ||
                drv.device_attribute(&info->cc_minor, CU_ATTR_COMPUTE_CAP_MINOR, dev) != 0)
                info->cc_major = info->cc_minor = 0;
        }
    }
    return 0;
}

enum mg_device mg_device_auto(int device_index, char *why, size_t len)
{
    const struct mg_gpu_plugin *p;
    char msg[MG_ERRMSG_LEN];
    if (!MG_HAVE_CUDA) {
        mg_seterr(why, len, 0, "this build of mg has no CUDA plugin");
        return MG_DEVICE_CPU;
    }
    if (mg_gpu_probe(device_index, NULL, msg, sizeof(msg)) < 0 ||
        mg_gpu_plugin_get(&p, msg, sizeof(msg)) < 0) {
        mg_seterr(why, len, 0, "%s", msg);
        return MG_DEVICE_CPU;
    }
    if (why && len)
        why[0] = '\0';
    return MG_DEVICE_CUDA;
}

/* ---- the entry points ------------------------------------------------------------------- */

int mg_cuda_backend_create(const struct mg_backend_opts *opts, struct mg_backend **out, char *err,
                           size_t errlen)
{
    const struct mg_gpu_plugin *p;
    *out = NULL;
    if (!MG_HAVE_CUDA)
        return mg_gpu_plugin_get(&p, err, errlen);
    /* The driver first: it answers in a millisecond, and more clearly than the
     * CUDA runtime would, where loading the plugin loads cuBLAS and cuDNN. */
    int rc = mg_gpu_probe(opts->device_index, NULL, err, errlen);
    if (rc < 0)
        return rc;
    rc = mg_gpu_plugin_get(&p, err, errlen);
    if (rc < 0)
        return rc;
    return p->backend_create(opts, out, err, errlen);
}

int mg_comm_nccl_create(struct mg_comm **out, struct mg_store *store,
                        const struct mg_comm_opts *opts, char *err, size_t errlen)
{
    const struct mg_gpu_plugin *p;
    int rc;
    *out = NULL;
    if (!MG_HAVE_NCCL)
        return mg_seterr(err, errlen, -MG_EUNSUPPORTED,
                         "this build of mg has no NCCL communicator (it was built without nvcc, "
                         "cuDNN and NCCL; see docs/gpu.md)");
    /* -1: the caller has set the device; NCCL says what it makes of it */
    if (opts->device_index >= 0) {
        rc = mg_gpu_probe(opts->device_index, NULL, err, errlen);
        if (rc < 0)
            return rc;
    }
    rc = mg_gpu_plugin_get(&p, err, errlen);
    if (rc < 0)
        return rc;
    return p->comm_create(out, store, opts, err, errlen);
}
