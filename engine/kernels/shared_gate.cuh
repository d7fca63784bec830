// The shared expert's gate of one row (the hybrid families' mixtures: engine/model/hybrid.py), sigmoid(h . w) for h
// (dim,) fp16 and w (dim,) fp32, taken by a block of THREADS threads: thread t's products over octets t, t +
// THREADS, ... in order, the threads' partials summed by block_sum's tree. norm_rope.cu's add_gated_rms_norm
// takes every row's gate here, prompt rows and decode rows alike.
#pragma once
#include <cuda_fp16.h>

#include "add_norm.cuh"
#include "block_sum.cuh"

// Eight fp16 values from 16-byte aligned p, as floats.
__device__ __forceinline__ void load_half8(const __half* p, float* v) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const __half2* h = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        const float2 f = __half22float2(h[e]);
        v[2 * e] = f.x, v[2 * e + 1] = f.y;
    }
}

template <int THREADS>
__device__ __forceinline__ float shared_gate(const __half* __restrict__ h, const float* __restrict__ w, int dim) {
    float acc = 0.f;
    for (int o = threadIdx.x; o < dim / 8; o += THREADS) {
        float hv[8], wv[8];
        load_half8(h + 8 * o, hv);
        load8(w + 8 * o, wv);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc = fmaf(hv[e], wv[e], acc);
    }
    return 1.f / (1.f + expf(-block_sum<THREADS>(acc)));
}
