// Activations in 8 bits, for the quantized matvecs' integer dot products (quant.cu). Included by
// every kernel file whose kernels write a decode row: the row's producer quantizes it as it writes it.
#pragma once
#include <cuda_fp16.h>

// x (k,) as k / 32 units {q[32] int8, d, s[2], s01}: x_j ~ d * q_j with d = max |x| / 127 over
// the unit; the terms a weight's offset m multiplies: s01 = d * the sum of all 32 (the matvecs'
// unit_add, matvec.cuh), s[h] = d * the sum of half h (the MoE experts' matvec, unit_dot_q8).
struct Q8 {
    int q[8];  // 32 int8, byte i of q[j] is value 4j + i
    float d, s[2], s01;
};
static_assert(sizeof(Q8) == 48, "Q8 units are read as three 16-byte loads");

__device__ __forceinline__ void quantize_unit(const float* v, Q8* out) {
    float amax = 0.f;
#pragma unroll
    for (int j = 0; j < 32; ++j) amax = fmaxf(amax, fabsf(v[j]));
    const float d = __fdiv_rn(amax, 127.f), inv = amax > 0.f ? __fdiv_rn(127.f, amax) : 0.f;  // as NumPy rounds
    Q8 u;
    int sum[2] = {0, 0};
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        unsigned word = 0;
#pragma unroll
        for (int b = 0; b < 4; ++b) {
            const int q = __float2int_rn(v[4 * i + b] * inv);
            sum[i / 4] += q;
            word |= (unsigned)(q & 0xFF) << (8 * b);
        }
        u.q[i] = (int)word;
    }
    u.d = d, u.s[0] = d * sum[0], u.s[1] = d * sum[1], u.s01 = d * (sum[0] + sum[1]);
    const uint4* src = reinterpret_cast<const uint4*>(&u);
    uint4* dst = reinterpret_cast<uint4*>(out);
    dst[0] = src[0], dst[1] = src[1], dst[2] = src[2];
}

// Eight values a thread: four consecutive lanes (lane & 3 = which eight) hold one unit's 32 values
// and write them as fp16 (out: this thread's eight) and, when q8 is given, as that unit's Q8 (the
// same bytes quantize_unit makes of the fp16 values). Every lane of the warp must call it (it
// shuffles); a lane past the end passes valid = false and stores nothing.
__device__ __forceinline__ void store_octet(__half* out, Q8* q8, float* v, bool valid) {
    __half2 h[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        h[j] = __floats2half2_rn(v[2 * j], v[2 * j + 1]);
        const float2 r = __half22float2(h[j]);  // quantize what the fp16 row holds
        v[2 * j] = r.x, v[2 * j + 1] = r.y;
    }
    if (valid) *reinterpret_cast<uint4*>(out) = *reinterpret_cast<uint4*>(h);
    if (q8 == nullptr) return;
    float amax = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(v[j]));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
    const float d = __fdiv_rn(amax, 127.f), inv = amax > 0.f ? __fdiv_rn(127.f, amax) : 0.f;
    int sum = 0;
    unsigned w[2] = {0u, 0u};
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const int q = __float2int_rn(v[j] * inv);
        sum += q;
        w[j / 4] |= (unsigned)(q & 0xFF) << (8 * (j % 4));
    }
    const int half_sum = sum + __shfl_xor_sync(0xffffffffu, sum, 1);  // lanes 0-1: values 0-15; 2-3: 16-31
    const int other = __shfl_xor_sync(0xffffffffu, half_sum, 2);
    const int part = threadIdx.x & 3;
    if (!valid) return;
    reinterpret_cast<uint2*>(q8->q)[part] = make_uint2(w[0], w[1]);
    if (part == 0) *reinterpret_cast<float4*>(&q8->d) = make_float4(d, d * half_sum, d * other, d * (half_sum + other));
}

// One value a lane, a warp's 32 lanes one unit: stored as fp16 at out (this lane's place), and, when q8 is given,
// the unit's Q8 of the fp16 values (the bytes quantize_unit makes of them: a max, integer sums, each exact in any
// order). Every lane of the warp must call it (it shuffles).
__device__ __forceinline__ void store_lane(__half* out, Q8* q8, float v) {
    const __half h = __float2half(v);
    *out = h;
    if (q8 == nullptr) return;
    const float x = __half2float(h);
    float amax = fabsf(x);
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float d = __fdiv_rn(amax, 127.f), inv = amax > 0.f ? __fdiv_rn(127.f, amax) : 0.f;
    const int q = __float2int_rn(x * inv), lane = threadIdx.x & 31;
    int half_sum = q;  // lanes 0-15: values 0-15's sum; 16-31: 16-31's
    for (int o = 8; o > 0; o >>= 1) half_sum += __shfl_xor_sync(0xffffffffu, half_sum, o);
    const int other = __shfl_xor_sync(0xffffffffu, half_sum, 16);
    reinterpret_cast<signed char*>(q8->q)[lane] = (signed char)q;
    if (lane == 0) *reinterpret_cast<float4*>(&q8->d) = make_float4(d, d * half_sum, d * other, d * (half_sum + other));
}
