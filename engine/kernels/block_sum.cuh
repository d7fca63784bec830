// The sum of one float from each of a block's THREADS threads, returned to every thread: each warp's
// by a butterfly, then the warps' partials by one more (a fixed order: the same inputs give the same
// bits). Used by the norms (norm_rope.cu, add_norm.cuh) and the MoE router (moe.cu).
#pragma once

// The same sum over THREADS * V values, as block_sum<THREADS * V> of THREADS * V threads makes it, taken by
// THREADS threads holding V each: thread t's v[j] is what thread t + j * THREADS would hold. A warp's V values
// are V warps' in that block (lanes as theirs), so each goes through its own butterfly, and the partials
// are then summed in the larger block's order. (A matvec's block of 128 threads normalizes a row as the
// norm kernel's 256 threads do: quant.cu's matvec_norm.)
template <int THREADS, int V>
__device__ __forceinline__ float block_sum_of(const float (&v)[V]) {
    constexpr int WARPS = THREADS * V / 32;
    static_assert(THREADS % 32 == 0 && WARPS <= 32, "whole warps, at most 32 of them in all");
    __shared__ float partial[WARPS];
#pragma unroll
    for (int j = 0; j < V; ++j) {
        float a = v[j];
        for (int o = 16; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
        if ((threadIdx.x & 31) == 0) partial[(threadIdx.x >> 5) + j * (THREADS / 32)] = a;
    }
    __syncthreads();
    float s = threadIdx.x < WARPS ? partial[threadIdx.x] : 0.f;
    if (threadIdx.x < 32)
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    __shared__ float total;
    if (threadIdx.x == 0) total = s;
    __syncthreads();
    return total;
}

template <int THREADS>
__device__ __forceinline__ float block_sum(float v) {
    const float one[1] = {v};
    return block_sum_of<THREADS, 1>(one);
}
