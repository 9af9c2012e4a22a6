/* Run-time loading and configuration of the BLAS (see blas.h). */
#include "blas.h"
#include "mg_err.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct mg_blas blas;
static int blas_rc;
static char blas_err[MG_ERRMSG_LEN];
static int blas_threads;
static pthread_once_t blas_once = PTHREAD_ONCE_INIT;

/* Sets name=value for the duration of the load, unless the user set it. */
struct env_save {
    const char *name;
    int set;
};

static void env_push(struct env_save *e, const char *name, const char *value)
{
    e->name = name;
    e->set = 0;
    if (getenv(name))
        return; /* the user's setting wins */
    if (setenv(name, value, 1) == 0)
        e->set = 1;
}

static void env_pop(struct env_save *e)
{
    if (e->set)
        unsetenv(e->name);
}

static void load_once(void)
{
    static const char *const libs[] = {"libopenblas.so.0", "libopenblas.so", "libblas.so.3"};
    char threads[16];
    struct env_save env_threads;
    void *h = NULL;

    snprintf(threads, sizeof(threads), "%d", blas_threads > 0 ? blas_threads : 1);
    env_push(&env_threads, "OPENBLAS_NUM_THREADS", threads);
    const char *first_err = NULL;
    for (size_t i = 0; i < sizeof(libs) / sizeof(libs[0]) && !h; i++) {
        h = dlopen(libs[i], RTLD_NOW | RTLD_LOCAL);
        if (h)
            blas.library = libs[i];
        else if (!first_err)
            first_err = dlerror();
    }
    env_pop(&env_threads);
    if (!h) {
        blas_rc = mg_seterr(blas_err, sizeof(blas_err), -ENOENT,
                            "cannot load a BLAS (libopenblas.so.0): %s",
                            first_err ? first_err : "not found");
        return;
    }
    *(void **)&blas.sgemm = dlsym(h, "cblas_sgemm");
    *(void **)&blas.set_num_threads = dlsym(h, "openblas_set_num_threads");
    char *(*corename)(void);
    *(void **)&corename = dlsym(h, "openblas_get_corename");
    if (!blas.sgemm) {
        blas_rc =
            mg_seterr(blas_err, sizeof(blas_err), -ENOENT, "%s has no cblas_sgemm", blas.library);
        return;
    }
    if (corename && corename())
        snprintf(blas.core, sizeof(blas.core), "%s", corename());
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
