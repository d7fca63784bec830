// The sum of one float from each of a block's THREADS threads, returned to every thread: each warp's
// by a butterfly, then the warps' partials by one more (a fixed order: the same inputs give the same
// bits). Used by the norms (norm_rope.cu) and the MoE router (moe.cu).
#pragma once

template <int THREADS>
__device__ __forceinline__ float block_sum(float v) {
    static_assert(THREADS % 32 == 0 && THREADS <= 1024, "whole warps, at most 32 of them");
    __shared__ float partial[THREADS / 32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = v;
    __syncthreads();
    v = threadIdx.x < THREADS / 32 ? partial[threadIdx.x] : 0.f;
    if (threadIdx.x < 32)
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __shared__ float total;
    if (threadIdx.x == 0) total = v;
    __syncthreads();
    return total;
}
