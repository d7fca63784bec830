// The residual add and RMSNorm of one row: x += delta, out = x / sqrt(mean(x^2) + eps) * w, and out's Q8
// units. norm_rope.cu's add_rms_norm is a block of NORM_THREADS threads a row holding the row in registers;
// add_norm_row is the same arithmetic in the same order by a smaller block (THREADS threads, each doing
// the work of NORM_THREADS / THREADS of the norm kernel's), the row kept in global memory between the sum
// of squares and the outputs: the tail of quant.cu's matvec_norm, whose last block normalizes the row its
// blocks produced. Both give the same bits.
#pragma once
#include <cuda_fp16.h>

#include "block_sum.cuh"
#include "q8.cuh"

constexpr int NORM_THREADS = 256;  // add_rms_norm: one block a row; rows are 576..12288 wide
constexpr int NORM_OCTETS = 6;     // eight values a thread this many times: rows up to 8 * 256 * 6 = 12288 wide

// Eight consecutive fp32 values from 32-byte aligned p.
__device__ __forceinline__ void load8(const float* p, float* v) {
    const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

// v[0..8) += the eight fp16 values of delta's octet o (a 16-byte load; through L2 alone when another block
// wrote them in this kernel: l2_only).
__device__ __forceinline__ void add_octet(float* v, const __half* __restrict__ delta, int o, bool l2_only) {
    const uint4* p = reinterpret_cast<const uint4*>(delta) + o;
    const uint4 raw = l2_only ? __ldcg(p) : *p;
    const __half2* h = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        const float2 f = __half22float2(h[e]);
        v[2 * e] += f.x, v[2 * e + 1] += f.y;
    }
}

__device__ __forceinline__ void store8(float* p, const float* v) {
    reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
}

// One row (dim values, dim % 32 == 0) by a block of THREADS threads: thread t does what the norm kernel's
// threads t, t + THREADS, ... (V of them) do, each octet o = its thread + NORM_THREADS i; a norm thread's
// sum of squares is its own chain, summed by block_sum_of as block_sum<NORM_THREADS> sums them. delta
// (written by other blocks of this kernel) read through L2.
template <int THREADS>
__device__ __forceinline__ void add_norm_row(float* __restrict__ x, const __half* __restrict__ delta,
                                             const float* __restrict__ w, __half* __restrict__ out,
                                             Q8* __restrict__ q8, int dim, float eps) {
    constexpr int V = NORM_THREADS / THREADS;
    static_assert(NORM_THREADS % THREADS == 0, "a whole number of the norm kernel's threads a thread");
    const int octets = dim / 8;
    float ss[V];
#pragma unroll
    for (int j = 0; j < V; ++j) {
        ss[j] = 0.f;
        for (int o = threadIdx.x + j * THREADS; o < octets; o += NORM_THREADS) {
            float v[8];
            load8(x + 8 * o, v);
            add_octet(v, delta, o, true);
            store8(x + 8 * o, v);
#pragma unroll
            for (int e = 0; e < 8; ++e) ss[j] = fmaf(v[e], v[e], ss[j]);
        }
    }
    const float scale = rsqrtf(block_sum_of<THREADS, V>(ss) / dim + eps);
#pragma unroll
    for (int j = 0; j < V; ++j)
        for (int i = 0; i * NORM_THREADS < octets; ++i) {  // every lane goes round alike (store_octet)
            const int o = threadIdx.x + j * THREADS + i * NORM_THREADS;
            const bool valid = o < octets;
            float r[8] = {};
            if (valid) {
                float v[8], wv[8];
                load8(x + 8 * o, v);
                load8(w + 8 * o, wv);
#pragma unroll
                for (int e = 0; e < 8; ++e) r[e] = v[e] * scale * wv[e];
            }
            store_octet(out + 8 * o, q8 ? q8 + o / 4 : nullptr, r, valid);
        }
}
