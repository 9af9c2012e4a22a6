/* Kernels that break CUDA's rules on purpose, built for the host only (with
 * runtime/cuda/simt.h), so test_cuda_kernels can check that the shim stops
 * them with a message instead of computing something: on a GPU each of these
 * is undefined behaviour or a hang. Also a correct block reduction and the
 * same one with its first barrier removed, to show what a missing barrier
 * does to a result. */
#include "simt.h"

#include <stddef.h>

extern "C" {
int simt_fault_sync_after_return(void);
int simt_fault_deadlock(void);
int simt_fault_shuffle_returned_lane(void);
int simt_fault_too_many_threads(void);
int simt_block_sum(float *out, const float *x, int n, int threads, int with_barrier);
}

__global__ void k_sync_after_return(float *x)
{
    if (threadIdx.x == 3)
        return;
    __syncthreads();
    x[threadIdx.x] = 1.0f;
}

__global__ void k_deadlock(float *x)
{
    /* lanes 48..63 wait for their whole warp at __syncwarp, lanes 32..47 of
     * that warp wait at __syncthreads for them: neither can go on */
    if (threadIdx.x < 48)
        __syncthreads();
    else
        __syncwarp();
    x[threadIdx.x] = 1.0f;
}

__global__ void k_shuffle_returned_lane(float *x)
{
    if (threadIdx.x == 5)
        return;
    x[threadIdx.x] = __shfl_down_sync(0xffffffffu, x[threadIdx.x], 1);
}

__global__ void k_block_sum(float *out, const float *x, int n, int with_barrier)
{
    __shared__ float sh[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
    float v = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        v += x[i];
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0)
        sh[warp] = v;
    if (with_barrier)
        __syncthreads();
    if (warp == 0) {
        v = lane < nwarps ? sh[lane] : 0.0f;
        for (int o = 16; o > 0; o >>= 1)
            v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0)
            *out = v;
    }
}

static float scratch[1024];

int simt_fault_sync_after_return(void)
{
    MGK_LAUNCH(k_sync_after_return, 1, 64, 0, 0, scratch);
    return (int)cudaGetLastError();
}

int simt_fault_deadlock(void)
{
    MGK_LAUNCH(k_deadlock, 1, 64, 0, 0, scratch);
    return (int)cudaGetLastError();
}

int simt_fault_shuffle_returned_lane(void)
{
    MGK_LAUNCH(k_shuffle_returned_lane, 1, 32, 0, 0, scratch);
    return (int)cudaGetLastError();
}

int simt_fault_too_many_threads(void)
{
    MGK_LAUNCH(k_sync_after_return, 1, 2048, 0, 0, scratch);
    return (int)cudaGetLastError();
}

int simt_block_sum(float *out, const float *x, int n, int threads, int with_barrier)
{
    MGK_LAUNCH(k_block_sum, 1, threads, 0, 0, out, x, n, with_barrier);
    return (int)cudaGetLastError();
}
