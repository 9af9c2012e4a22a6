/* Counts the calls that make the host wait for a GPU, for the GPU suite's
 * check that a training step has none (tests/gpu/sync_free.t): loaded with
 * LD_PRELOAD, it stands in front of the CUDA runtime's cudaStreamSynchronize,
 * cudaDeviceSynchronize, cudaEventSynchronize and cudaMemcpy, counts each
 * call and passes it on to the real runtime, and at exit appends one line to
 * the file MG_CUDAWAITS_OUT names:
 *   cudaStreamSynchronize N cudaDeviceSynchronize N cudaEventSynchronize N cudaMemcpy N
 * The CUDA plugin is loaded with dlopen and takes libcudart with it, so the
 * real functions are looked up in that already-loaded library (RTLD_NOLOAD;
 * MG_CUDAWAITS_LIB names it when it is not libcudart.so.13 or .12). Calls
 * made inside cuBLAS, cuDNN and NCCL, which carry their own static runtime,
 * are not seen. No CUDA header is needed: it builds on every machine
 * (tests/integration/cuda_waits.t checks it against the real runtime). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    STREAM,
    DEVICE,
    EVENT,
    MEMCPY,
    NWAITS
};
static const char *const names[NWAITS] = {"cudaStreamSynchronize", "cudaDeviceSynchronize",
                                          "cudaEventSynchronize", "cudaMemcpy"};
static unsigned long counts[NWAITS];

/* The runtime's own function; NULL when it cannot be found (then the call
 * fails as CUDA's "not initialized" would, 3). */
static void *real(int which)
{
    static void *fn[NWAITS];
    if (fn[which])
        return fn[which];
    void *f = dlsym(RTLD_NEXT, names[which]);
    const char *lib = getenv("MG_CUDAWAITS_LIB");
    const char *const libs[] = {lib && *lib ? lib : "libcudart.so.13", "libcudart.so.12",
                                "libcudart.so"};
    for (size_t i = 0; !f && i < sizeof(libs) / sizeof(libs[0]); i++) {
        void *h = dlopen(libs[i], RTLD_LAZY | RTLD_NOLOAD);
        if (h)
            f = dlsym(h, names[which]);
    }
    fn[which] = f;
    return f;
}

static void count(int which)
{
    __atomic_add_fetch(&counts[which], 1, __ATOMIC_RELAXED);
}

int cudaStreamSynchronize(void *stream);
int cudaDeviceSynchronize(void);
int cudaEventSynchronize(void *event);
int cudaMemcpy(void *dst, const void *src, size_t bytes, int kind);

int cudaStreamSynchronize(void *stream)
{
    int (*f)(void *) = (int (*)(void *))real(STREAM);
    count(STREAM);
    return f ? f(stream) : 3;
}

int cudaDeviceSynchronize(void)
{
    int (*f)(void) = (int (*)(void))real(DEVICE);
    count(DEVICE);
    return f ? f() : 3;
}

int cudaEventSynchronize(void *event)
{
    int (*f)(void *) = (int (*)(void *))real(EVENT);
    count(EVENT);
    return f ? f(event) : 3;
}

int cudaMemcpy(void *dst, const void *src, size_t bytes, int kind)
{
    int (*f)(void *, const void *, size_t, int) =
        (int (*)(void *, const void *, size_t, int))real(MEMCPY);
    count(MEMCPY);
    return f ? f(dst, src, bytes, kind) : 3;
}

__attribute__((destructor)) static void report(void)
{
    const char *path = getenv("MG_CUDAWAITS_OUT");
    FILE *f = path && *path ? fopen(path, "a") : NULL;
    if (!f)
        return;
    for (int i = 0; i < NWAITS; i++)
        fprintf(f, "%s%s %lu", i ? " " : "", names[i], counts[i]);
    fputc('\n', f);
    fclose(f);
}
