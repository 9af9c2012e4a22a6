/* The BLAS behind the CPU backend, loaded at run time (dlopen), so that libmg
 * can configure OpenBLAS before it starts: OpenBLAS reads its thread count from
 * the environment once, when it is loaded, and starts that many threads.
 * OPENBLAS_NUM_THREADS is set to the backend's thread count for the load when
 * the user has not set it, so no idle BLAS threads spin beside the training
 * process (and results do not depend on how many there are); it is removed
 * again afterwards, so child processes do not inherit it. OpenBLAS picks its
 * kernels itself (OPENBLAS_CORETYPE overrides). Libraries tried in order:
 * libopenblas.so.0, libopenblas.so, libblas.so.3 (any CBLAS). Call before
 * starting threads (setenv). */
#ifndef MG_BLAS_H
#define MG_BLAS_H

#include "mg_err.h"

enum {
    MG_BLAS_ROW_MAJOR = 101,
    MG_BLAS_NO_TRANS = 111,
    MG_BLAS_TRANS = 112,
};

struct mg_blas {
    void (*sgemm)(int order, int trans_a, int trans_b, int m, int n, int k, float alpha,
                  const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc);
    void (*set_num_threads)(int n); /* NULL when the library has none */
    const char *library;            /* the file loaded */
    char core[32];                  /* OpenBLAS kernel family, "" for another BLAS */
};

/* Loads the BLAS once per process (later calls return the same one). On
 * failure the message is in err (MG_ERRMSG_LEN bytes). */
int mg_blas_load(int threads, const struct mg_blas **out, char *err);

#endif
