/* Run-time loading and configuration of the BLAS (see blas.h). */
#include "blas.h"
#include "cpu_features.h"
#include "mg_err.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static struct mg_blas blas;
static int blas_rc;
static char blas_err[MG_ERRMSG_LEN];
static int blas_threads;
static pthread_once_t blas_once = PTHREAD_ONCE_INIT;

static const char *const libs[] = {"libopenblas.so.0", "libopenblas.so", "libblas.so.3"};

/* Sets name=value for the duration of the load, unless the user set it. */
struct env_save {
    const char *name;
    int set;
};

static void env_push(struct env_save *e, const char *name, const char *value)
{
    const char *v = getenv(name);
    e->name = name;
    e->set = 0;
    if (v && *v)
        return; /* the user's setting wins */
    if (setenv(name, value, 1) == 0)
        e->set = 1;
}

static void env_pop(struct env_save *e)
{
    if (e->set)
        unsetenv(e->name);
    e->set = 0;
}

static void *open_library(const char **first_err)
{
    void *h = NULL;
    *first_err = NULL;
    for (size_t i = 0; i < sizeof(libs) / sizeof(libs[0]) && !h; i++) {
        h = dlopen(libs[i], RTLD_NOW | RTLD_LOCAL);
        if (h)
            blas.library = libs[i];
        else if (!*first_err)
            *first_err = dlerror();
    }
    return h;
}

/* Another part of the process (a library linked against it) holds it: then
 * unloading ours would not unload it, and a reload would change nothing. */
static int loaded_before(void)
{
    for (size_t i = 0; i < sizeof(libs) / sizeof(libs[0]); i++) {
        void *h = dlopen(libs[i], RTLD_NOW | RTLD_NOLOAD);
        if (h) {
            dlclose(h);
            return 1;
        }
    }
    return 0;
}

static void bind_library(void *h)
{
    *(void **)&blas.sgemm = dlsym(h, "cblas_sgemm");
    *(void **)&blas.set_num_threads = dlsym(h, "openblas_set_num_threads");
    char *(*corename)(void);
    *(void **)&corename = dlsym(h, "openblas_get_corename");
    blas.core[0] = '\0';
    if (corename && corename())
        snprintf(blas.core, sizeof(blas.core), "%s", corename());
}

/* Only a DYNAMIC_ARCH build carries several families to choose from. */
static int has_families(void *h)
{
    char *(*config)(void);
    *(void **)&config = dlsym(h, "openblas_get_config");
    return config && config() && strstr(config(), "DYNAMIC_ARCH");
}

static void load_once(void)
{
    char threads[16];
    struct env_save env_threads, env_core = {0};
    const char *first_err, *mg = getenv("MG_BLAS_CORETYPE"), *family = NULL;
    const char *user = getenv("OPENBLAS_CORETYPE");
    int mg_library = 0;

    if (mg && *mg && strcasecmp(mg, "auto") != 0) {
        if (strcasecmp(mg, "library") == 0) {
            mg_library = 1;
        } else if (!(family = mg_openblas_core_name(mg))) {
            blas_rc =
                mg_seterr(blas_err, sizeof(blas_err), -MG_ECONFIG,
                          "MG_BLAS_CORETYPE='%s' is not auto, library or an OpenBLAS x86-64 "
                          "kernel family (SkylakeX, Haswell, Zen, Sandybridge, Prescott, ...)",
                          mg);
            return;
        }
    }
    struct mg_cpu_id id;
    mg_cpu_id_read(&id);
    blas.cpu_isa = (int)mg_cpu_isa(&id);
    int before = loaded_before();

    snprintf(threads, sizeof(threads), "%d", blas_threads > 0 ? blas_threads : 1);
    env_push(&env_threads, "OPENBLAS_NUM_THREADS", threads);
    if (user && *user) {
        blas.origin = MG_BLAS_FROM_OPENBLAS_ENV;
        snprintf(blas.requested, sizeof(blas.requested), "%s", user);
    } else if (family) {
        blas.origin = MG_BLAS_FROM_MG_ENV;
        snprintf(blas.requested, sizeof(blas.requested), "%s", family);
        env_push(&env_core, "OPENBLAS_CORETYPE", family);
    } else {
        blas.origin = mg_library ? MG_BLAS_FROM_MG_LIBRARY : MG_BLAS_FROM_LIBRARY;
    }
    void *h = open_library(&first_err);
    env_pop(&env_core);
    if (h) {
        bind_library(h);
        if (blas.origin == MG_BLAS_FROM_LIBRARY || blas.origin == MG_BLAS_FROM_MG_LIBRARY)
            snprintf(blas.library_core, sizeof(blas.library_core), "%s", blas.core);
    }
    const char *better = h && blas.origin == MG_BLAS_FROM_LIBRARY && blas.core[0]
                             ? mg_openblas_core_for(&id, blas.core)
                             : NULL;
    if (better && (before || !has_families(h))) {
        blas.origin = MG_BLAS_FROM_LIBRARY_ONLY;
        blas.no_reload = before ? "OpenBLAS was loaded before libmg"
                                : "this OpenBLAS was built with one kernel family";
    } else if (better) {
        /* nothing has run in the library yet: unload it, load it again forced */
        dlclose(h);
        blas.origin = MG_BLAS_FROM_FEATURES;
        snprintf(blas.requested, sizeof(blas.requested), "%s", better);
        env_push(&env_core, "OPENBLAS_CORETYPE", better);
        h = open_library(&first_err);
        env_pop(&env_core);
        if (h)
            bind_library(h);
    }
    env_pop(&env_threads);
    if (!h) {
        blas_rc = mg_seterr(blas_err, sizeof(blas_err), -ENOENT,
                            "cannot load a BLAS (libopenblas.so.0): %s",
                            first_err ? first_err : "not found");
        return;
    }
    if (!blas.sgemm)
        blas_rc =
            mg_seterr(blas_err, sizeof(blas_err), -ENOENT, "%s has no cblas_sgemm", blas.library);
}

int mg_blas_load(int threads, const struct mg_blas **out, char *err)
{
    blas_threads = threads;
    pthread_once(&blas_once, load_once);
    if (blas_rc < 0) {
        return mg_seterr(err, MG_ERRMSG_LEN, blas_rc, "%s", blas_err);
    }
    if (blas.set_num_threads)
        blas.set_num_threads(threads > 0 ? threads : 1);
    *out = &blas;
    return 0;
}

void mg_blas_describe(const struct mg_blas *b, int threads, char *buf, size_t len)
{
    char t[32];
    snprintf(t, sizeof(t), "%d thread%s", threads, threads == 1 ? "" : "s");
    if (!b->core[0]) {
        snprintf(buf, len, "%s, %s", b->library, t);
        return;
    }
    int core_isa = mg_openblas_core_isa(b->core);
    const char *isa = mg_isa_name((enum mg_isa)b->cpu_isa);
    char below[64] = "";
    if (core_isa >= 0 && core_isa < b->cpu_isa)
        snprintf(below, sizeof(below), "; this CPU has %s", isa);
    char lacks[96] = "";
    if (b->requested[0] && strcasecmp(b->requested, b->core) != 0)
        snprintf(lacks, sizeof(lacks), "; %s was asked for, the library has no such kernels",
                 b->requested);
    switch (b->origin) {
    case MG_BLAS_FROM_FEATURES:
        snprintf(buf, len,
                 "OpenBLAS %s kernels chosen for %s, %s; the library picked %s for this CPU%s",
                 b->core, isa, t, b->library_core, lacks);
        return;
    case MG_BLAS_FROM_OPENBLAS_ENV:
        snprintf(buf, len, "OpenBLAS %s set by OPENBLAS_CORETYPE, %s%s%s", b->core, t, below,
                 lacks);
        return;
    case MG_BLAS_FROM_MG_ENV:
        snprintf(buf, len, "OpenBLAS %s set by MG_BLAS_CORETYPE, %s%s%s", b->core, t, below, lacks);
        return;
    case MG_BLAS_FROM_MG_LIBRARY:
        snprintf(buf, len, "OpenBLAS %s, the library's choice (MG_BLAS_CORETYPE=library), %s%s",
                 b->core, t, below);
        return;
    case MG_BLAS_FROM_LIBRARY_ONLY:
        snprintf(buf, len, "OpenBLAS %s, %s%s, but %s", b->core, t, below, b->no_reload);
        return;
    case MG_BLAS_FROM_LIBRARY:
        break;
    }
    snprintf(buf, len, "OpenBLAS %s, %s%s", b->core, t, below);
}
