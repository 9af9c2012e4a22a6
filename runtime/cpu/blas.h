/* The BLAS behind the CPU backend, loaded at run time (dlopen), so that libmg
 * can configure OpenBLAS before it starts: OpenBLAS reads its thread count and
 * its kernel family from the environment once, when it is loaded.
 *
 * Threads: OPENBLAS_NUM_THREADS is set to the backend's thread count for the
 * load when the user has not set it, so no idle BLAS threads spin beside the
 * training process (and results do not depend on how many there are).
 *
 * Kernels: OpenBLAS picks its family from a table of CPU model numbers and
 * falls back to SSE3 ("Prescott") on a model newer than the library. libmg
 * asks the loaded library which family it picked and compares it with what
 * the processor supports (cpu_features.h); when the library fell below, it
 * unloads it and loads it again with OPENBLAS_CORETYPE set to the family that
 * fits (a load costs 2 to 6 ms; nothing has run in the library yet). The
 * user's OPENBLAS_CORETYPE always wins, then MG_BLAS_CORETYPE: `auto` (the
 * default, as above), `library` (OpenBLAS's own choice, even below the CPU),
 * or a family name (forced for the load).
 *
 * Both variables are removed again after the load, so child processes do not
 * inherit them. Libraries tried in order: libopenblas.so.0, libopenblas.so,
 * libblas.so.3 (any CBLAS). Call before starting threads (setenv). */
#ifndef MG_BLAS_H
#define MG_BLAS_H

#include "mg_err.h"

#include <stddef.h>

enum {
    MG_BLAS_ROW_MAJOR = 101,
    MG_BLAS_NO_TRANS = 111,
    MG_BLAS_TRANS = 112,
};

/* Who chose the kernel family. */
enum mg_blas_origin {
    MG_BLAS_FROM_LIBRARY,      /* OpenBLAS, at the CPU's level (or not OpenBLAS) */
    MG_BLAS_FROM_FEATURES,     /* libmg, for the CPU's instruction set: the library fell below */
    MG_BLAS_FROM_OPENBLAS_ENV, /* the user's OPENBLAS_CORETYPE */
    MG_BLAS_FROM_MG_ENV,       /* MG_BLAS_CORETYPE=<family> */
    MG_BLAS_FROM_MG_LIBRARY,   /* MG_BLAS_CORETYPE=library */
    MG_BLAS_FROM_LIBRARY_ONLY, /* the library fell below and could not be reloaded */
};

struct mg_blas {
    void (*sgemm)(int order, int trans_a, int trans_b, int m, int n, int k, float alpha,
                  const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc);
    void (*set_num_threads)(int n); /* NULL when the library has none */
    const char *library;            /* the file loaded */
    char core[32];                  /* OpenBLAS kernel family, "" for another BLAS */
    char library_core[32];          /* the family OpenBLAS picked itself, "" when not asked */
    char requested[32];             /* the family libmg or the user asked for, "" for none */
    enum mg_blas_origin origin;
    int cpu_isa;           /* enum mg_isa: the processor's level */
    const char *no_reload; /* FROM_LIBRARY_ONLY: why the library kept its choice */
};

/* Loads the BLAS once per process (later calls return the same one). On
 * failure the message is in err (MG_ERRMSG_LEN bytes; may be NULL): no BLAS
 * found, or a bad MG_BLAS_CORETYPE (MG_ECONFIG). */
int mg_blas_load(int threads, const struct mg_blas **out, char *err);

/* What runs and why, for train's first line: "OpenBLAS SkylakeX, 1 thread", or
 * "OpenBLAS SkylakeX kernels chosen for AVX-512, 1 thread; the library picked
 * Prescott for this CPU". */
void mg_blas_describe(const struct mg_blas *b, int threads, char *buf, size_t len);

#endif
