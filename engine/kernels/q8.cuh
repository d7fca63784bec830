// Activations in 8 bits, for the quantized matvecs' integer dot products (quant.cu). Included by
// every kernel file whose kernels write a decode row: the row's producer quantizes it as it writes it.
#pragma once
#include <cuda_fp16.h>

// x (k,) as k / 32 units {q[32] int8, d, s[2]}: x_j ~ d * q_j with d = max |x| / 127 over the
// unit, s[h] = d * sum of the unit's half h (the term a weight's offset m multiplies).
struct Q8 {
    int q[8];  // 32 int8, byte i of q[j] is value 4j + i
    float d, s[2], pad;
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
    u.d = d, u.s[0] = d * sum[0], u.s[1] = d * sum[1], u.pad = 0.f;
    const uint4* src = reinterpret_cast<const uint4*>(&u);
    uint4* dst = reinterpret_cast<uint4*>(out);
    dst[0] = src[0], dst[1] = src[1], dst[2] = src[2];
}

// 32 floats -> fp16 (as stored) and, when q8 is given, that fp16 row's Q8 unit.
__device__ __forceinline__ void store_unit(__half* out, Q8* q8, float* v) {
    uint4* o = reinterpret_cast<uint4*>(out);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        __half2 h[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            h[j] = __floats2half2_rn(v[8 * i + 2 * j], v[8 * i + 2 * j + 1]);
            const float2 r = __half22float2(h[j]);  // quantize what the fp16 row holds
            v[8 * i + 2 * j] = r.x, v[8 * i + 2 * j + 1] = r.y;
        }
        o[i] = *reinterpret_cast<uint4*>(h);
    }
    if (q8) quantize_unit(v, q8);
}
