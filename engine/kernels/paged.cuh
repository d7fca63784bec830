#pragma once
// Paged KV rows (engine/kv.py): a layer's pool is (blocks, kv_heads, 1 << block_log2, d), and a
// sequence's position p of K/V head h is row p & (B - 1) of block tbl[p >> block_log2], tbl being
// that sequence's block table (kv_row.cuh).
//
// A pool holds fp16 values, or q8_0 (engine/kv_types.py): int8 values at the same element offsets
// and a separate (blocks, kv_heads, B, d / 32) fp16 array of scales, one per 32 values of a row
// (value = q * scale), so the scale of the value at offset e is scales[e / 32].
#include <cuda_fp16.h>

#include "kv_row.cuh"

// A warp stores 32 consecutive values of a cached row (one q8_0 group: lane i holds the value at
// offset at, at - lane being a multiple of 32) as q8_0, rounded as engine/kv_types.py quantize_q8_0:
// the scale is max |x| / 127 rounded to fp16, each value rint(x / scale) in [-127, 127]. Every lane calls it.
__device__ __forceinline__ void store_q8_0(signed char* __restrict__ q, __half* __restrict__ scales, size_t at,
                                           float x) {
    float amax = fabsf(x);
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const __half scale = __float2half_rn(__fdiv_rn(amax, 127.f));
    const float wide = __half2float(scale), inv = wide != 0.f ? __fdiv_rn(1.f, wide) : 0.f;
    q[at] = (signed char)max(-127, min(127, __float2int_rn(x * inv)));
    if ((threadIdx.x & 31) == 0) scales[at / 32] = scale;
}

// A value of a K or V row into the pool at element offset `at`: fp16, or q8_0 when scales is not
// null (then the whole warp must be storing one group, as store_q8_0 says).
__device__ __forceinline__ void store_kv(void* __restrict__ pool, __half* __restrict__ scales, size_t at, float x) {
    if (scales != nullptr) store_q8_0(static_cast<signed char*>(pool), scales, at, x);
    else static_cast<__half*>(pool)[at] = __float2half(x);
}
