/* The host side of simt.h, for tests: a kernel file built by g++ runs here,
 * on one OS thread, without a GPU or the CUDA toolkit.
 *
 * Blocks run one after another. Each CUDA thread of a block is a fiber
 * (ucontext, its own stack with a guard page), run in thread order until it
 * returns or reaches a barrier, so every run is deterministic. __shared__ is
 * `static`: only one block is live at a time. __syncthreads() and the warp
 * operations (shuffles, __syncwarp) are barriers between fibers; a shuffle
 * exchanges values through a per-thread slot. Atomics are plain
 * read-modify-writes (fibers switch only at barriers).
 *
 * What a GPU leaves undefined stops the run with a message on stderr and
 * abort(): __syncthreads() after some threads of the block returned, threads
 * waiting at different barriers (a hang on a GPU), a warp operation whose mask
 * names a lane that returned or does not exist. Launch limits (1024 threads
 * per block, block.z <= 64, grid.y/z <= 65535, 48 KiB of dynamic shared
 * memory) fail the launch as CUDA does: cudaGetLastError() reports it.
 * Dynamic shared memory is filled with 0xff (NaN) before every block.
 *
 * Not modelled: concurrency between blocks, memory ordering, warp lockstep
 * without __syncwarp, and the GPU's float numerics (expf, FMA contraction):
 * the host's are used. Speed: about a microsecond per CUDA thread. */
#ifndef MG_SIMT_HOST_H
#define MG_SIMT_HOST_H

#ifdef __CUDACC__
#error "simt_host.h is the host build of a kernel file; nvcc uses cuda_runtime.h"
#endif

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define MGK_SIM_ASAN        1
#define MGK_SIM_STACK_BYTES (128u << 10) /* its shadow is cleared at every switch: keep it small */
#else
#define MGK_SIM_ASAN        0
#define MGK_SIM_STACK_BYTES (64u << 10)
#endif

#define MGK_SIM_MAX_THREADS 1024
#define MGK_SIM_MAX_SHARED  (48u << 10)

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_)
    {
    }
};

struct uint3 {
    unsigned x, y, z;
};

typedef int cudaError_t;
enum {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorInvalidConfiguration = 9,
};
typedef struct mgk_sim_stream *cudaStream_t;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__      static
#define warpSize        32

enum mgk_sim_state_kind {
    MGK_SIM_READY,
    MGK_SIM_WAIT_BLOCK,
    MGK_SIM_WAIT_WARP,
    MGK_SIM_DONE,
};

struct mgk_sim_thread {
    ucontext_t ctx;
    char *stack;
    uint3 tid;
    int linear; /* index in the block: x fastest, as CUDA numbers lanes */
    int state;
    unsigned warp_mask; /* MGK_SIM_WAIT_WARP: the lanes it waits with */
    uint64_t slot;      /* a shuffle's value */
    void *asan_fake;
};

struct mgk_sim_state {
    struct mgk_sim_thread *threads; /* MGK_SIM_MAX_THREADS, made on the first launch */
    int nthreads;
    struct mgk_sim_thread *cur;
    uint3 block;
    dim3 bdim, gdim;
    ucontext_t sched;
    void (*call)(void);
    const void *fn;
    const char *kernel;
    cudaError_t last_error;
    unsigned char *dyn_shared;
    size_t dyn_bytes;
    const void *sched_bottom;
    size_t sched_size;
};

static struct mgk_sim_state mgk_sim;

#define threadIdx (mgk_sim.cur->tid)
#define blockIdx  (mgk_sim.block)
#define blockDim  (mgk_sim.bdim)
#define gridDim   (mgk_sim.gdim)

__attribute__((format(printf, 1, 2), noreturn)) static inline void mgk_sim_die(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "simt: kernel %s, block (%u,%u,%u): ", mgk_sim.kernel ? mgk_sim.kernel : "?",
            mgk_sim.block.x, mgk_sim.block.y, mgk_sim.block.z);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    fflush(stderr);
    abort();
}

static inline const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case cudaSuccess:
        return "no error";
    case cudaErrorInvalidValue:
        return "invalid argument";
    case cudaErrorInvalidConfiguration:
        return "invalid configuration argument";
    default:
        return "unknown error";
    }
}

static inline cudaError_t cudaGetLastError(void)
{
    cudaError_t e = mgk_sim.last_error;
    mgk_sim.last_error = cudaSuccess;
    return e;
}

/* MGK_PRELOAD on the host: nothing to load; counts, so a test sees the list ran. */
static int mgk_sim_preloaded;
static inline cudaError_t mgk_sim_preload(const char *kernel)
{
    (void)kernel;
    mgk_sim_preloaded++;
    return cudaSuccess;
}

static inline void *mgk_sim_dynamic_shared(void)
{
    return mgk_sim.dyn_shared;
}

/* Back to the scheduler; the fiber resumes here when it is released. */
static inline void mgk_sim_yield(int state)
{
    struct mgk_sim_thread *t = mgk_sim.cur;
    t->state = state;
#if MGK_SIM_ASAN
    __sanitizer_start_switch_fiber(&t->asan_fake, mgk_sim.sched_bottom, mgk_sim.sched_size);
#endif
    swapcontext(&t->ctx, &mgk_sim.sched);
#if MGK_SIM_ASAN
    __sanitizer_finish_switch_fiber(t->asan_fake, &mgk_sim.sched_bottom, &mgk_sim.sched_size);
#endif
}

static inline void __syncthreads(void)
{
    mgk_sim_yield(MGK_SIM_WAIT_BLOCK);
}

static inline void mgk_sim_warp_wait(unsigned mask)
{
    unsigned lane = (unsigned)mgk_sim.cur->linear & 31u;
    if (!((mask >> lane) & 1u))
        mgk_sim_die("lane %u uses a warp operation with mask 0x%08x, which leaves it out", lane,
                    mask);
    mgk_sim.cur->warp_mask = mask;
    mgk_sim_yield(MGK_SIM_WAIT_WARP);
}

static inline void __syncwarp(unsigned mask = 0xffffffffu)
{
    mgk_sim_warp_wait(mask);
}

/* Every lane of mask publishes v, then reads lane src (of its warp). */
template <class T>
static inline T mgk_sim_shfl(unsigned mask, T v, int src)
{
    static_assert(sizeof(T) <= sizeof(uint64_t), "shuffles move at most 8 bytes");
    struct mgk_sim_thread *t = mgk_sim.cur;
    memcpy(&t->slot, &v, sizeof(v));
    mgk_sim_warp_wait(mask);
    int from = (t->linear & ~31) + src;
    if (from >= mgk_sim.nthreads || !((mask >> src) & 1u))
        mgk_sim_die("thread %d shuffles from lane %d, which is not in mask 0x%08x or the block",
                    t->linear, src, mask);
    T out;
    memcpy(&out, &mgk_sim.threads[from].slot, sizeof(out));
    mgk_sim_warp_wait(mask); /* no lane overwrites its slot before every lane read */
    return out;
}

template <class T>
static inline T __shfl_sync(unsigned mask, T v, int src_lane, int width = warpSize)
{
    int lane = mgk_sim.cur->linear & 31;
    return mgk_sim_shfl(mask, v, (lane & ~(width - 1)) + (src_lane & (width - 1)));
}

template <class T>
static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = warpSize)
{
    int lane = mgk_sim.cur->linear & 31, src = lane ^ lane_mask;
    return mgk_sim_shfl(mask, v, src / width > lane / width ? lane : src);
}

template <class T>
static inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = warpSize)
{
    int lane = mgk_sim.cur->linear & 31, src = lane + (int)delta;
    return mgk_sim_shfl(mask, v, src / width != lane / width ? lane : src);
}

template <class T>
static inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = warpSize)
{
    int lane = mgk_sim.cur->linear & 31, src = lane - (int)delta;
    return mgk_sim_shfl(mask, v, src < 0 || src / width != lane / width ? lane : src);
}

template <class T>
static inline T atomicAdd(T *p, T v)
{
    T old = *p;
    *p = old + v;
    return old;
}

template <class T>
static inline T atomicMax(T *p, T v)
{
    T old = *p;
    *p = old > v ? old : v;
    return old;
}

template <class F>
static inline void mgk_sim_call(void)
{
    (*(const F *)mgk_sim.fn)();
}

static inline void mgk_sim_entry(void)
{
#if MGK_SIM_ASAN
    __sanitizer_finish_switch_fiber(NULL, &mgk_sim.sched_bottom, &mgk_sim.sched_size);
#endif
    mgk_sim.call();
    mgk_sim.cur->state = MGK_SIM_DONE;
#if MGK_SIM_ASAN
    __sanitizer_start_switch_fiber(NULL, mgk_sim.sched_bottom, mgk_sim.sched_size);
#endif
    /* returning resumes uc_link: the scheduler */
}

static inline void mgk_sim_setup(void)
{
    if (mgk_sim.threads)
        return;
    long page = sysconf(_SC_PAGESIZE);
    mgk_sim.threads =
        (struct mgk_sim_thread *)calloc(MGK_SIM_MAX_THREADS, sizeof(struct mgk_sim_thread));
    if (!mgk_sim.threads)
        mgk_sim_die("out of memory for %d fibers", MGK_SIM_MAX_THREADS);
    for (int i = 0; i < MGK_SIM_MAX_THREADS; i++) {
        /* a guard page below each stack turns an overflow into a crash, not corruption */
        char *m = (char *)mmap(NULL, MGK_SIM_STACK_BYTES + (size_t)page, PROT_READ | PROT_WRITE,
                               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED || mprotect(m, (size_t)page, PROT_NONE) != 0)
            mgk_sim_die("cannot map a fiber stack");
        mgk_sim.threads[i].stack = m + page;
    }
}

static inline void mgk_sim_run(struct mgk_sim_thread *t)
{
    mgk_sim.cur = t;
#if MGK_SIM_ASAN
    void *fake = NULL;
    __sanitizer_start_switch_fiber(&fake, t->stack, MGK_SIM_STACK_BYTES);
#endif
    swapcontext(&mgk_sim.sched, &t->ctx);
#if MGK_SIM_ASAN
    __sanitizer_finish_switch_fiber(fake, NULL, NULL);
#endif
}

/* Releases the warps whose every lane of the mask waits at the same warp
 * barrier; returns whether one was. */
static inline int mgk_sim_release_warps(void)
{
    int n = mgk_sim.nthreads, released = 0;
    struct mgk_sim_thread *th = mgk_sim.threads;
    for (int lo = 0; lo < n; lo += 32) {
        int hi = lo + 32 < n ? lo + 32 : n, ok = 1;
        unsigned mask = 0;
        for (int l = lo; l < hi && !mask; l++)
            if (th[l].state == MGK_SIM_WAIT_WARP)
                mask = th[l].warp_mask;
        if (!mask)
            continue;
        for (int b = 0; b < 32; b++) {
            if (!((mask >> b) & 1u))
                continue;
            if (lo + b >= hi)
                mgk_sim_die("warp mask 0x%08x names lane %d, beyond the block's %d threads", mask,
                            b, n);
            if (th[lo + b].state == MGK_SIM_DONE)
                mgk_sim_die("a warp operation with mask 0x%08x waits for lane %d, which returned",
                            mask, b);
            if (th[lo + b].state != MGK_SIM_WAIT_WARP || th[lo + b].warp_mask != mask)
                ok = 0;
        }
        if (!ok)
            continue;
        for (int b = 0; b < 32; b++)
            if ((mask >> b) & 1u)
                th[lo + b].state = MGK_SIM_READY;
        released = 1;
    }
    return released;
}

/* Out of line: getcontext returns twice, which the caller's loop must not see. */
__attribute__((noinline)) static void mgk_sim_make_fiber(struct mgk_sim_thread *t, int i)
{
    t->linear = i;
    t->tid.x = (unsigned)i % mgk_sim.bdim.x;
    t->tid.y = (unsigned)i / mgk_sim.bdim.x % mgk_sim.bdim.y;
    t->tid.z = (unsigned)i / (mgk_sim.bdim.x * mgk_sim.bdim.y);
    t->state = MGK_SIM_READY;
    if (getcontext(&t->ctx) != 0)
        mgk_sim_die("getcontext failed");
    t->ctx.uc_stack.ss_sp = t->stack;
    t->ctx.uc_stack.ss_size = MGK_SIM_STACK_BYTES;
    t->ctx.uc_link = &mgk_sim.sched;
    makecontext(&t->ctx, mgk_sim_entry, 0);
}

static inline void mgk_sim_run_block(void)
{
    int n = mgk_sim.nthreads, ndone = 0;
    struct mgk_sim_thread *th = mgk_sim.threads;
    for (int i = 0; i < n; i++)
        mgk_sim_make_fiber(&th[i], i);
    if (mgk_sim.dyn_bytes)
        memset(mgk_sim.dyn_shared, 0xff, mgk_sim.dyn_bytes);
    for (;;) {
        for (int i = 0; i < n; i++)
            if (th[i].state == MGK_SIM_READY) {
                mgk_sim_run(&th[i]);
                ndone += th[i].state == MGK_SIM_DONE;
            }
        if (ndone == n)
            return;
        if (mgk_sim_release_warps())
            continue;
        int at_block = 0;
        for (int i = 0; i < n; i++)
            at_block += th[i].state == MGK_SIM_WAIT_BLOCK;
        if (at_block == n - ndone) {
            if (ndone)
                mgk_sim_die("__syncthreads() after %d of the block's %d threads returned "
                            "(undefined on a GPU: it may hang)",
                            ndone, n);
            for (int i = 0; i < n; i++)
                th[i].state = MGK_SIM_READY;
            continue;
        }
        mgk_sim_die("deadlock: %d threads wait at __syncthreads(), %d at a warp operation that "
                    "not every lane of its mask reaches (a GPU would hang)",
                    at_block, n - ndone - at_block);
    }
}

template <class F>
static inline void mgk_sim_launch(const char *name, dim3 grid, dim3 block, size_t shmem,
                                  cudaStream_t stream, F f)
{
    (void)stream; /* one queue: every launch finishes before the next */
    unsigned long long nt = (unsigned long long)block.x * block.y * block.z;
    if (!grid.x || !grid.y || !grid.z || !nt || nt > MGK_SIM_MAX_THREADS || block.z > 64 ||
        grid.y > 65535 || grid.z > 65535 || grid.x > 0x7fffffffu) {
        mgk_sim.last_error = cudaErrorInvalidConfiguration;
        return;
    }
    if (shmem > MGK_SIM_MAX_SHARED) {
        mgk_sim.last_error = cudaErrorInvalidValue;
        return;
    }
    mgk_sim_setup();
    if (shmem > mgk_sim.dyn_bytes) {
        free(mgk_sim.dyn_shared);
        mgk_sim.dyn_shared = (unsigned char *)malloc(shmem);
        if (!mgk_sim.dyn_shared)
            mgk_sim_die("out of memory for %zu bytes of shared memory", shmem);
    }
    mgk_sim.dyn_bytes = shmem;
    mgk_sim.nthreads = (int)nt;
    mgk_sim.bdim = block;
    mgk_sim.gdim = grid;
    mgk_sim.fn = &f;
    mgk_sim.call = mgk_sim_call<F>;
    mgk_sim.kernel = name;
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                mgk_sim.block.x = x;
                mgk_sim.block.y = y;
                mgk_sim.block.z = z;
                mgk_sim_run_block();
            }
    mgk_sim.fn = NULL;
    mgk_sim.kernel = NULL;
}

#endif
