/* What a kernel file includes, so that one source builds two ways: with nvcc
 * for the GPU (CUDA's own runtime header), and with g++ for the host tests
 * (simt_host.h, which runs every CUDA thread of a block as a fiber). The
 * kernels use the CUDA subset both sides implement: threadIdx and friends,
 * __shared__, __syncthreads, warp shuffles, and the two macros below in place
 * of the launch chevrons and `extern __shared__`, which are not C++. */
#ifndef MG_SIMT_H
#define MG_SIMT_H

#ifdef __CUDACC__

#include <cuda_runtime.h>

#define MGK_LAUNCH(kernel, grid, block, shmem, stream, ...)                                        \
    kernel<<<(grid), (block), (shmem), (stream)>>>(__VA_ARGS__)
#define MGK_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
/* Loads the kernel's module now (CUDA loads lazily: at the first launch otherwise). */
#define MGK_PRELOAD(kernel)                                                                        \
    ([]() {                                                                                        \
        cudaFuncAttributes a_;                                                                     \
        return cudaFuncGetAttributes(&a_, kernel);                                                 \
    }())

#else

#include "simt_host.h"

/* Every thread runs the lambda; the arguments are evaluated in each one, as
 * a kernel's parameters are copied to each thread on a GPU. */
#define MGK_LAUNCH(kernel, grid, block, shmem, stream, ...)                                        \
    mgk_sim_launch(#kernel, (grid), (block), (shmem), (stream), [=]() { kernel(__VA_ARGS__); })
#define MGK_DYNAMIC_SHARED(type, name) type *name = (type *)mgk_sim_dynamic_shared()
#define MGK_PRELOAD(kernel)            mgk_sim_preload(#kernel)

#endif

#endif
