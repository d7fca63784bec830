// GGUF weight blocks (ggml-common.h) decoded on the GPU, shared by the kernels that read weights
// in their blocks (quant.cu: dequantization, embedding rows, matvecs; moe.cu: the experts). One
// decoder per type turns a "unit" of 32 consecutive values of a row (a block, or a sub-block of
// a K-quant super-block) into 32 unsigned bytes and an affine pair per 16 values: value = d * byte
// + m (the types' offsets, Q4_0's -8 or Q6_K's -32, live in m). F16 rows are read as values.
#pragma once
#include <cuda_fp16.h>

#include "q8.cuh"

using u8 = unsigned char;
using u16 = unsigned short;

struct Raw {
    unsigned w[8];     // the 32 values as unsigned bytes: byte i of w[j] is value 4j + i
    float d[2], m[2];  // value j = d[j / 16] * byte j + m[j / 16]; both halves the same unless T::TWO_SCALES
};

// What one lane of a tensor-core tile takes of a unit (mmq.cu): words c and 4 + c of Raw::w
// (values 4c..4c+3 of each half) and the unit's affine pairs. Each type's pair() reads only those.
struct Pair {
    unsigned lo, hi;
    float d[2], m[2];
};

__device__ __forceinline__ float f16_at(const u8* p) { return __half2float(*reinterpret_cast<const __half*>(p)); }

// Bits 0..3 of b (< 16) moved to bit 4 of bytes 0..3: the fifth bits of four Q5 values.
__device__ __forceinline__ unsigned fifth_bits(unsigned b) { return ((b * 0x00204081u) & 0x01010101u) << 4; }

// WORDS little-endian 32-bit words from an address aligned to 2, 4 or 16 bytes. From a 2-byte
// aligned address: the aligned words around it, joined by funnel shifts (fewer loads than 16-bit ones).
template <int WORDS>
__device__ __forceinline__ void load_a2(const u8* p, unsigned (&w)[WORDS]) {
    const unsigned* base = reinterpret_cast<const unsigned*>(reinterpret_cast<size_t>(p) & ~(size_t)3);
    const int shift = (reinterpret_cast<size_t>(p) & 3) * 8;  // 0 or 16
    unsigned raw[WORDS + 1];
#pragma unroll
    for (int i = 0; i < WORDS; ++i) raw[i] = base[i];
    raw[WORDS] = shift ? base[WORDS] : 0u;  // past the field only when it is needed
#pragma unroll
    for (int i = 0; i < WORDS; ++i) w[i] = __funnelshift_r(raw[i], raw[i + 1], shift);
}
template <int WORDS>
__device__ __forceinline__ void load_a4(const u8* p, unsigned (&w)[WORDS]) {
    const unsigned* h = reinterpret_cast<const unsigned*>(p);
#pragma unroll
    for (int i = 0; i < WORDS; ++i) w[i] = h[i];
}
template <int WORDS>
__device__ __forceinline__ void load_a16(const u8* p, unsigned (&w)[WORDS]) {
    const uint4* h = reinterpret_cast<const uint4*>(p);
#pragma unroll
    for (int i = 0; i < WORDS / 4; ++i) {
        const uint4 v = h[i];
        w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
    }
}

template <class U>
__device__ __forceinline__ void same_scale(U& u, float d, float m) { u.d[0] = u.d[1] = d, u.m[0] = u.m[1] = m; }

// The 32-value formats: {d, [m], [qh[4]], qs[16]}. Q4_0: d * (q - 8); Q4_1: d * q + m; Q5_0 (the
// fifth bit of value j is bit j of qh): d * (q - 16); Q5_1: d * q + m. Low nibbles are values
// 0..15, high nibbles 16..31. Fields are 2-byte aligned in blocks of 18 or 22 bytes, 4-byte
// aligned in blocks of 20 or 24.
template <int BYTES_, bool HAS_MIN, bool FIFTH_BIT>
struct Q32 {
    static constexpr int QK = 32, BYTES = BYTES_;
    static constexpr bool TWO_SCALES = false;
    static constexpr int QH = HAS_MIN ? 4 : 2, QS = QH + (FIFTH_BIT ? 4 : 0);
    __device__ static void decode(const u8* row, int s, Raw& u) {
        const u8* p = row + s * BYTES;
        unsigned qh[1] = {0u}, qs[4];
        if (BYTES % 4 == 0) {
            if (FIFTH_BIT) load_a4(p + QH, qh);
            load_a4(p + QS, qs);
        } else {
            if (FIFTH_BIT) load_a2(p + QH, qh);
            load_a2(p + QS, qs);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            u.w[i] = (qs[i] & 0x0F0F0F0Fu) | fifth_bits((qh[0] >> (4 * i)) & 0xFu);
            u.w[4 + i] = ((qs[i] >> 4) & 0x0F0F0F0Fu) | fifth_bits((qh[0] >> (16 + 4 * i)) & 0xFu);
        }
        const float d = f16_at(p);
        same_scale(u, d, HAS_MIN ? f16_at(p + 2) : -(FIFTH_BIT ? 16.f : 8.f) * d);
    }
    // Words c and 4 + c of decode's u.w (values 4c..4c+3 of each half): both from qs word c.
    __device__ static void pair(const u8* row, int s, int c, Pair& u) {
        const u8* p = row + s * BYTES;
        unsigned qh[1] = {0u}, qs[1];
        if (BYTES % 4 == 0) {
            if (FIFTH_BIT) load_a4(p + QH, qh);
            load_a4(p + QS + 4 * c, qs);
        } else {
            if (FIFTH_BIT) load_a2(p + QH, qh);
            load_a2(p + QS + 4 * c, qs);
        }
        u.lo = (qs[0] & 0x0F0F0F0Fu) | fifth_bits((qh[0] >> (4 * c)) & 0xFu);
        u.hi = ((qs[0] >> 4) & 0x0F0F0F0Fu) | fifth_bits((qh[0] >> (16 + 4 * c)) & 0xFu);
        const float d = f16_at(p);
        same_scale(u, d, HAS_MIN ? f16_at(p + 2) : -(FIFTH_BIT ? 16.f : 8.f) * d);
    }
};
using Q4_0 = Q32<18, false, false>;
using Q4_1 = Q32<20, true, false>;
using Q5_0 = Q32<22, false, true>;
using Q5_1 = Q32<24, true, true>;

// Q8_0 {d, qs[32] int8}: d * q, read as the unsigned q + 128 with m = -128 d.
struct Q8_0 {
    static constexpr int QK = 32, BYTES = 34;
    static constexpr bool TWO_SCALES = false;
    __device__ static void decode(const u8* row, int s, Raw& u) {
        const u8* p = row + s * BYTES;
        load_a2(p + 2, u.w);
#pragma unroll
        for (int i = 0; i < 8; ++i) u.w[i] ^= 0x80808080u;
        const float d = f16_at(p);
        same_scale(u, d, -128.f * d);
    }
    __device__ static void pair(const u8* row, int s, int c, Pair& u) {
        const u8* p = row + s * BYTES;
        unsigned lo[1], hi[1];
        load_a2(p + 2 + 4 * c, lo);
        load_a2(p + 18 + 4 * c, hi);
        u.lo = lo[0] ^ 0x80808080u, u.hi = hi[0] ^ 0x80808080u;
        const float d = f16_at(p);
        same_scale(u, d, -128.f * d);
    }
};

__device__ __forceinline__ unsigned byte_at(unsigned w, int i) { return (w >> (8 * i)) & 0xFFu; }

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K super-block, from the header's
// scales[12] as three words.
__device__ __forceinline__ void scale_min_k4(int j, unsigned s03, unsigned s47, unsigned s811, float* sc, float* mn) {
    if (j < 4) {
        *sc = byte_at(s03, j) & 63;
        *mn = byte_at(s47, j) & 63;
    } else {
        *sc = (byte_at(s811, j - 4) & 0xF) | ((byte_at(s03, j - 4) >> 6) << 4);
        *mn = (byte_at(s811, j - 4) >> 4) | ((byte_at(s47, j - 4) >> 6) << 4);
    }
}

// Q4_K {d, dmin, scales[12], qs[128]} and Q5_K {d, dmin, scales[12], qh[32], qs[128]} per 256
// values: sub-block sb (unit s) takes the low (even sb) or high (odd sb) nibbles of qs[32 * (sb / 2)
// ...], Q5_K's fifth bit of value l is bit sb of qh[l]; value = d * sc * q - dmin * mn with the
// sub-block's 6-bit scale and min.
template <int BYTES_, bool FIFTH_BIT>
struct K4 {
    static constexpr int QK = 256, BYTES = BYTES_;
    static constexpr bool TWO_SCALES = false;
    __device__ static void decode(const u8* row, int s, Raw& u) {
        const int sb = s & 7;
        const u8* p = row + (s >> 3) * BYTES;
        unsigned qh[8] = {}, qs[8];
        if (FIFTH_BIT) load_a16(p + 16, qh);
        load_a16(p + (FIFTH_BIT ? 48 : 16) + 32 * (sb >> 1), qs);
        const int shift = (sb & 1) * 4;
#pragma unroll
        for (int i = 0; i < 8; ++i) u.w[i] = ((qs[i] >> shift) & 0x0F0F0F0Fu) | (((qh[i] >> sb) & 0x01010101u) << 4);
        const uint4 head = *reinterpret_cast<const uint4*>(p);  // d, dmin, scales[12]
        const float2 dm = __half22float2(*reinterpret_cast<const __half2*>(&head.x));
        float sc, mn;
        scale_min_k4(sb, head.y, head.z, head.w, &sc, &mn);
        same_scale(u, dm.x * sc, -dm.y * mn);
    }
    __device__ static void pair(const u8* row, int s, int c, Pair& u) {
        const int sb = s & 7, shift = (sb & 1) * 4;
        const u8* p = row + (s >> 3) * BYTES;
        const unsigned* qs = reinterpret_cast<const unsigned*>(p + (FIFTH_BIT ? 48 : 16) + 32 * (sb >> 1));
        const unsigned* qh = reinterpret_cast<const unsigned*>(p + 16);
        u.lo = (qs[c] >> shift) & 0x0F0F0F0Fu, u.hi = (qs[4 + c] >> shift) & 0x0F0F0F0Fu;
        if (FIFTH_BIT) u.lo |= ((qh[c] >> sb) & 0x01010101u) << 4, u.hi |= ((qh[4 + c] >> sb) & 0x01010101u) << 4;
        const uint4 head = *reinterpret_cast<const uint4*>(p);
        const float2 dm = __half22float2(*reinterpret_cast<const __half2*>(&head.x));
        float sc, mn;
        scale_min_k4(sb, head.y, head.z, head.w, &sc, &mn);
        same_scale(u, dm.x * sc, -dm.y * mn);
    }
};
using Q4_K = K4<144, false>;
using Q5_K = K4<176, true>;

// Q6_K {ql[128], qh[64], scales[16] int8, d} per 256 values, two halves of 128. In half h,
// quarter k (sub-block sb = 4h + k), value l: low 4 bits from ql[64h + 32(k&1) + l] (low nibble for
// k < 2, high for k >= 2), high 2 bits from qh[32h + l] >> 2k; d * scales[8h + 2k + l/16] * (q - 32).
struct Q6_K {
    static constexpr int QK = 256, BYTES = 210;
    static constexpr bool TWO_SCALES = true;  // a scale every 16 values: a unit's halves differ
    static constexpr int ZERO = 32;           // the byte of a zero value (m = -32 d)
    // Bytes q (0..63) as the signed bytes q - 32: bit 5 flipped, then copied into bits 6 and 7.
    __device__ static unsigned centered(unsigned w) {
        const unsigned t = w ^ 0x20202020u;
        return t | ((t & 0x20202020u) * 6u);
    }
    __device__ static void decode(const u8* row, int s, Raw& u) {
        const int sb = s & 7, h = sb >> 2, k = sb & 3;
        const u8* p = row + (s >> 3) * BYTES;
        unsigned ql[8], qh[8];
        load_a2(p + 64 * h + 32 * (k & 1), ql);
        load_a2(p + 128 + 32 * h, qh);
        const int lo_shift = (k >> 1) * 4, hi_shift = 2 * k;
#pragma unroll
        for (int i = 0; i < 8; ++i) u.w[i] = ((ql[i] >> lo_shift) & 0x0F0F0F0Fu) | (((qh[i] >> hi_shift) & 0x03030303u) << 4);
        const signed char* scales = reinterpret_cast<const signed char*>(p + 192 + 8 * h + 2 * k);
        const float d = f16_at(p + 208);
        u.d[0] = d * scales[0], u.d[1] = d * scales[1];
        u.m[0] = -32.f * u.d[0], u.m[1] = -32.f * u.d[1];
    }
    __device__ static void pair(const u8* row, int s, int c, Pair& u) {
        const int sb = s & 7, h = sb >> 2, k = sb & 3;
        const u8* p = row + (s >> 3) * BYTES;
        unsigned ql[2], qh[2], w[1];
        load_a2(p + 64 * h + 32 * (k & 1) + 4 * c, w), ql[0] = w[0];
        load_a2(p + 64 * h + 32 * (k & 1) + 16 + 4 * c, w), ql[1] = w[0];
        load_a2(p + 128 + 32 * h + 4 * c, w), qh[0] = w[0];
        load_a2(p + 128 + 32 * h + 16 + 4 * c, w), qh[1] = w[0];
        const int lo_shift = (k >> 1) * 4, hi_shift = 2 * k;
        u.lo = ((ql[0] >> lo_shift) & 0x0F0F0F0Fu) | (((qh[0] >> hi_shift) & 0x03030303u) << 4);
        u.hi = ((ql[1] >> lo_shift) & 0x0F0F0F0Fu) | (((qh[1] >> hi_shift) & 0x03030303u) << 4);
        const signed char* scales = reinterpret_cast<const signed char*>(p + 192 + 8 * h + 2 * k);
        const float d = f16_at(p + 208);
        u.d[0] = d * scales[0], u.d[1] = d * scales[1];
        u.m[0] = -32.f * u.d[0], u.m[1] = -32.f * u.d[1];
    }
};

// F16 rows: 32 values of 2 bytes (no Raw form: values() reads them as they are).
struct F16 {
    static constexpr int QK = 32, BYTES = 64;
};
template <class T>
constexpr bool is_f16 = false;
template <>
constexpr bool is_f16<F16> = true;

template <class T>
__device__ __forceinline__ size_t row_bytes(int cols) { return (size_t)(cols / T::QK) * T::BYTES; }

// 32 fp16 values (16-byte aligned) -> floats.
__device__ __forceinline__ void load_half32(const __half* src, float* v) {
    const uint4* p = reinterpret_cast<const uint4*>(src);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const uint4 raw = p[i];
        const __half2* h = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const float2 f = __half22float2(h[j]);
            v[8 * i + 2 * j] = f.x, v[8 * i + 2 * j + 1] = f.y;
        }
    }
}

// Unit s of a row as 32 floats. Bytes become exact floats by one byte permute each (0x4B0000bb is
// the float 2^23 + bb) and one FADD: cheaper than shifts, masks and integer-to-float conversions.
template <class T>
__device__ __forceinline__ void values(const u8* row, int s, float* v) {
    if constexpr (is_f16<T>) {
        load_half32(reinterpret_cast<const __half*>(row) + s * 32, v);
    } else {
        Raw u;
        T::decode(row, s, u);
#pragma unroll
        for (int j = 0; j < 32; ++j) {
            const float q = __uint_as_float(__byte_perm(u.w[j / 4], 0x4B000000u, 0x7440 + j % 4)) - 8388608.f;
            v[j] = fmaf(u.d[j >> 4], q, u.m[j >> 4]);
        }
    }
}

__device__ __forceinline__ void store32(__half* out, const float* v) {
    uint4* o = reinterpret_cast<uint4*>(out);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        __half2 h[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) h[j] = __floats2half2_rn(v[8 * i + 2 * j], v[8 * i + 2 * j + 1]);
        o[i] = *reinterpret_cast<uint4*>(h);
    }
}

__device__ __forceinline__ void store32(float* out, const float* v) {
    float4* o = reinterpret_cast<float4*>(out);
#pragma unroll
    for (int i = 0; i < 8; ++i) o[i] = make_float4(v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]);
}

__device__ __forceinline__ int dp4a(unsigned a, int b, int c) {  // unsigned bytes of a . signed bytes of b + c
    int r;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}
