// GGUF block formats -> fp16, on the GPU, at load: the raw blocks go from the memory-mapped file
// to the device and are expanded there, never through float32 host copies. Layouts as in ggml
// (ggml-common.h); NumPy reference: gguf.quants.dequantize. A tensor's rows hold whole blocks,
// so the blocks of a (rows, cols) tensor are one flat array and block b is values [b*QK, b*QK+QK).
// One thread per 32 values (a block, or one sub-block of a 256-value K-quant super-block).
#include <cuda_fp16.h>

using u8 = unsigned char;
using i8 = signed char;

__device__ __forceinline__ float f16_at(const u8* p) {  // every fp16 field sits at an even offset
    return __half2float(*reinterpret_cast<const __half*>(p));
}

__device__ __forceinline__ unsigned u32_at(const u8* p) {  // qh fields: little-endian, unaligned
    return p[0] | (p[1] << 8) | (p[2] << 16) | ((unsigned)p[3] << 24);
}

#define THREAD_INDEX const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; if (i >= n) return

// Q4_0: {d, qs[16]}: y[j] = d * (lo(qs[j]) - 8), y[j+16] = d * (hi(qs[j]) - 8). n = blocks.
extern "C" __global__ void dequant_q4_0(const u8* __restrict__ src, __half* __restrict__ y, long long n) {
    THREAD_INDEX;
    const u8* p = src + i * 18;
    const float d = f16_at(p);
    __half* out = y + i * 32;
    for (int j = 0; j < 16; ++j) {
        out[j] = __float2half(d * ((p[2 + j] & 0xF) - 8));
        out[j + 16] = __float2half(d * ((p[2 + j] >> 4) - 8));
    }
}

// Q4_1: {d, m, qs[16]}: y = d * q + m.
extern "C" __global__ void dequant_q4_1(const u8* __restrict__ src, __half* __restrict__ y, long long n) {
    THREAD_INDEX;
    const u8* p = src + i * 20;
    const float d = f16_at(p), m = f16_at(p + 2);
    __half* out = y + i * 32;
    for (int j = 0; j < 16; ++j) {
        out[j] = __float2half(d * (p[4 + j] & 0xF) + m);
        out[j + 16] = __float2half(d * (p[4 + j] >> 4) + m);
    }
}

// Q5_0: {d, qh[4], qs[16]}: the fifth bit of value j is bit j of qh; y = d * (q - 16).
extern "C" __global__ void dequant_q5_0(const u8* __restrict__ src, __half* __restrict__ y, long long n) {
    THREAD_INDEX;
    const u8* p = src + i * 22;
    const float d = f16_at(p);
    const unsigned qh = u32_at(p + 2);
    __half* out = y + i * 32;
    for (int j = 0; j < 16; ++j) {
        const int lo = (p[6 + j] & 0xF) | (((qh >> j) << 4) & 0x10);
        const int hi = (p[6 + j] >> 4) | ((qh >> (j + 12)) & 0x10);
        out[j] = __float2half(d * (lo - 16));
        out[j + 16] = __float2half(d * (hi - 16));
    }
}

// Q5_1: {d, m, qh[4], qs[16]}: y = d * q + m.
extern "C" __global__ void dequant_q5_1(const u8* __restrict__ src, __half* __restrict__ y, long long n) {
    THREAD_INDEX;
    const u8* p = src + i * 24;
    const float d = f16_at(p), m = f16_at(p + 2);
    const unsigned qh = u32_at(p + 4);
    __half* out = y + i * 32;
    for (int j = 0; j < 16; ++j) {
        const int lo = (p[8 + j] & 0xF) | (((qh >> j) << 4) & 0x10);
        const int hi = (p[8 + j] >> 4) | ((qh >> (j + 12)) & 0x10);
        out[j] = __float2half(d * lo + m);
        out[j + 16] = __float2half(d * hi + m);
    }
}

// Q8_0: {d, qs[32] int8}: y = d * q.
extern "C" __global__ void dequant_q8_0(const u8* __restrict__ src, __half* __restrict__ y, long long n) {
    THREAD_INDEX;
    const u8* p = src + i * 34;
    const float d = f16_at(p);
    __half* out = y + i * 32;
    for (int j = 0; j < 32; ++j) out[j] = __float2half(d * (i8)p[2 + j]);
}

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K super-block.
__device__ __forceinline__ void scale_min_k4(int j, const u8* q, float* sc, float* m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// Sub-block sb of the Q4_K / Q5_K super-block at p: its value = d * q - dm.
__device__ __forceinline__ void scale_offset_k4(const u8* p, int sb, float* d, float* dm) {
    float sc, m;
    scale_min_k4(sb, p + 4, &sc, &m);
    *d = f16_at(p) * sc;
    *dm = f16_at(p + 2) * m;
}

// Q4_K: {d, dmin, scales[12], qs[128]} per 256 values; sub-block sb (32 values) uses the low
// (even sb) or high (odd sb) nibbles of qs[32 * (sb / 2) ...]: y = d * sc * q - dmin * m.
// n = super-blocks * 8.
extern "C" __global__ void dequant_q4_k(const u8* __restrict__ src, __half* __restrict__ y, long long n) {
    THREAD_INDEX;
    const int sb = i % 8;
    const u8* p = src + (i / 8) * 144;
    float d, dm;
    scale_offset_k4(p, sb, &d, &dm);
    const u8* q = p + 16 + 32 * (sb / 2);
    __half* out = y + i * 32;
    for (int l = 0; l < 32; ++l) out[l] = __float2half(d * ((sb & 1) ? q[l] >> 4 : q[l] & 0xF) - dm);
}

// Q5_K: {d, dmin, scales[12], qh[32], qs[128]}: the fifth bit of sub-block sb is bit sb of qh[l].
extern "C" __global__ void dequant_q5_k(const u8* __restrict__ src, __half* __restrict__ y, long long n) {
    THREAD_INDEX;
    const int sb = i % 8;
    const u8* p = src + (i / 8) * 176;
    float d, dm;
    scale_offset_k4(p, sb, &d, &dm);
    const u8* qh = p + 16;
    const u8* ql = p + 48 + 32 * (sb / 2);
    __half* out = y + i * 32;
    for (int l = 0; l < 32; ++l) {
        const int q = ((sb & 1) ? ql[l] >> 4 : ql[l] & 0xF) + ((qh[l] >> sb) & 1) * 16;
        out[l] = __float2half(d * q - dm);
    }
}

// Q6_K: {ql[128], qh[64], scales[16] int8, d} per 256 values, two halves of 128. In half h,
// quarter k (sub-block sb = 4h + k), value l: low 4 bits from ql[64h + l + 32*(k&1)] (low nibble
// for k < 2, high for k >= 2), high 2 bits from qh[32h + l] >> 2k; y = d * scales[8h + l/16 + 2k] * (q - 32).
extern "C" __global__ void dequant_q6_k(const u8* __restrict__ src, __half* __restrict__ y, long long n) {
    THREAD_INDEX;
    const long long b = i / 8;
    const int sb = i % 8, h = sb / 4, k = sb % 4;
    const u8* p = src + b * 210;
    const u8* ql = p + 64 * h + 32 * (k & 1);
    const u8* qh = p + 128 + 32 * h;
    const i8* scales = reinterpret_cast<const i8*>(p + 192) + 8 * h;
    const float d = f16_at(p + 208);
    __half* out = y + i * 32;
    for (int l = 0; l < 32; ++l) {
        const int lo = k < 2 ? ql[l] & 0xF : ql[l] >> 4;
        const int q = (lo | (((qh[l] >> (2 * k)) & 3) << 4)) - 32;
        out[l] = __float2half(d * scales[l / 16 + 2 * k] * q);
    }
}

// BF16 -> fp16 (a bf16 is the high half of an fp32). n = values.
extern "C" __global__ void dequant_bf16(const unsigned short* __restrict__ src, __half* __restrict__ y, long long n) {
    THREAD_INDEX;
    y[i] = __float2half(__uint_as_float((unsigned)src[i] << 16));
}
