// GGUF weight blocks (ggml-common.h) decoded on the GPU, shared by the kernels that read weights
// in their blocks (quant.cu: dequantization, embedding rows, matvecs; moe.cu: the experts). One
// decoder per type turns a "unit" of 32 consecutive values of a row (a block, or a sub-block of
// a K-quant super-block) into 32 unsigned bytes and an affine pair per 16 values: value = d * byte
// + m (the types' offsets, Q4_0's -8 or Q6_K's -32, live in m). F16 rows are read as values.
#pragma once
#include <cuda_fp16.h>

#include "iq_tables.cuh"
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

// ---------------------------------------------------------------- the IQ quants
// Their values are signed: a grid's magnitudes (iq_tables.cuh, from gguf's tables) with a sign each, or
// IQ4's sixteen levels, times a scale a unit (IQ2_XS and IQ2_S: a scale every 16 values). Read as the
// unsigned bytes value + ZERO (64; IQ4: 128) with m = -ZERO d, as Q8_0 is, so that the matvecs and mmq.cu
// take them as every other type. IQ<S> makes a type's decode and pair from its spec S: word(block, ib, i),
// bytes 4i..4i+3 of unit ib of the block (Raw::w[i]), and scales(block, ib, d), the unit's halves' scales.

// 7 sign bits with their parity as the eighth (ggml's ksigns_iq2xs: an even count of minus signs a group).
__device__ __forceinline__ unsigned signs8(unsigned s7) { return s7 | ((__popc(s7) & 1u) << 7); }

// Four magnitudes (the bytes of g, each below 64) with the signs of bits 0..3 of s -> the bytes 64 -+ g.
__device__ __forceinline__ unsigned signed_bytes(unsigned g, unsigned s) {
    const unsigned minus = ((s * 0x00204081u) & 0x01010101u) * 0xFFu;
    return (__vadd4(0x40404040u, g) & ~minus) | (__vsub4(0x40404040u, g) & minus);
}

// The 4-byte word at a 2-byte aligned address.
__device__ __forceinline__ unsigned word_a2(const u8* p) {
    unsigned w[1];
    load_a2(p, w);
    return w[0];
}

// Four IQ4 indices (a byte each, 0..15) -> their bytes (level + 128): two byte permutes of the table's halves.
__device__ __forceinline__ unsigned iq4_bytes(unsigned q) {
    unsigned sel = q & 0x07070707u;
    sel = (sel | (sel >> 4)) & 0x00FF00FFu;
    sel = (sel | (sel >> 8)) & 0x0000FFFFu;  // nibble k: index k's low 3 bits
    const unsigned lo = __byte_perm(IQ4_BYTES0, IQ4_BYTES1, sel), hi = __byte_perm(IQ4_BYTES2, IQ4_BYTES3, sel);
    const unsigned high = ((q & 0x08080808u) >> 3) * 0xFFu;
    return (lo & ~high) | (hi & high);
}

// A scale d * (0.5 + s) * f, rounded as gguf's dequantizers round it.
__device__ __forceinline__ float half_step(float d, unsigned s, float f) {
    return __fmul_rn(__fmul_rn(d, 0.5f + (float)s), f);
}

// IQ2_XS's and IQ2_S's two scales of a unit, from its byte sc: d (0.5 + nibble) / 4, the low nibble first.
__device__ __forceinline__ void nibble_scales(float d, unsigned sc, float (&out)[2]) {
    out[0] = half_step(d, sc & 15u, 0.25f), out[1] = half_step(d, sc >> 4, 0.25f);
}

template <class S>
struct IQ {
    static constexpr int QK = S::QK, BYTES = S::BYTES, ZERO = S::ZERO;
    static constexpr bool TWO_SCALES = S::TWO_SCALES;
    __device__ static const u8* block(const u8* row, int s) { return row + (QK == 32 ? s : s >> 3) * BYTES; }
    __device__ static int unit(int s) { return QK == 32 ? 0 : s & 7; }
    template <class U>
    __device__ static void affine(const u8* p, int ib, U& u) {
        float d[2];
        S::scales(p, ib, d);
        u.d[0] = d[0], u.d[1] = d[1], u.m[0] = -(float)ZERO * d[0], u.m[1] = -(float)ZERO * d[1];
    }
    __device__ static void decode(const u8* row, int s, Raw& u) {
        const u8* p = block(row, s);
#pragma unroll
        for (int i = 0; i < 8; ++i) u.w[i] = S::word(p, unit(s), i);
        affine(p, unit(s), u);
    }
    __device__ static void pair(const u8* row, int s, int c, Pair& u) {
        const u8* p = block(row, s);
        u.lo = S::word(p, unit(s), c), u.hi = S::word(p, unit(s), 4 + c);
        affine(p, unit(s), u);
    }
    __device__ static unsigned centered(unsigned w) { return __vsub4(w, (unsigned)ZERO * 0x01010101u); }  // q - ZERO
};

// IQ2_XXS {d, qs[64]} per 256: unit ib's 8 bytes at 2 + 8 ib: its four groups' grid indices, then a word of
// their 4 x 7 sign bits and the scale in its top 4 bits, d (0.5 + scale) / 4.
struct IQ2_XXS_S {
    static constexpr int QK = 256, BYTES = 66, ZERO = 64;
    static constexpr bool TWO_SCALES = false;
    __device__ static unsigned word(const u8* p, int ib, int i) {
        const int l = i >> 1, h = i & 1;
        const unsigned long long g = iq2xxs_grid[p[2 + 8 * ib + l]];
        const unsigned signs = signs8((word_a2(p + 6 + 8 * ib) >> (7 * l)) & 127u);
        return signed_bytes((unsigned)(g >> (32 * h)), (signs >> (4 * h)) & 15u);
    }
    __device__ static void scales(const u8* p, int ib, float (&d)[2]) {
        d[0] = d[1] = half_step(f16_at(p), word_a2(p + 6 + 8 * ib) >> 28, 0.25f);
    }
};
// IQ2_XS {d, qs[32] u16, scales[8]} per 256: entry 4 ib + l holds group l's grid index (9 bits) and 7 sign
// bits; scales[ib]'s nibbles scale its halves, d (0.5 + s) / 4.
struct IQ2_XS_S {
    static constexpr int QK = 256, BYTES = 74, ZERO = 64;
    static constexpr bool TWO_SCALES = true;
    __device__ static unsigned word(const u8* p, int ib, int i) {
        const int l = i >> 1, h = i & 1;
        const unsigned q = *reinterpret_cast<const u16*>(p + 2 + 8 * ib + 2 * l);
        const unsigned long long g = iq2xs_grid[q & 511u];
        return signed_bytes((unsigned)(g >> (32 * h)), (signs8(q >> 9) >> (4 * h)) & 15u);
    }
    __device__ static void scales(const u8* p, int ib, float (&d)[2]) { nibble_scales(f16_at(p), p[66 + ib], d); }
};
// IQ2_S {d, qs[32], signs[32], qh[8], scales[8]} per 256: group l of unit ib: grid index qs[4 ib + l] with
// bits 2l, 2l + 1 of qh[ib] above it, its signs the byte signs[4 ib + l]; scales as IQ2_XS's.
struct IQ2_S_S {
    static constexpr int QK = 256, BYTES = 82, ZERO = 64;
    static constexpr bool TWO_SCALES = true;
    __device__ static unsigned word(const u8* p, int ib, int i) {
        const int l = i >> 1, h = i & 1;
        const unsigned index = p[2 + 4 * ib + l] | ((((unsigned)p[66 + ib] >> (2 * l)) & 3u) << 8);
        const unsigned long long g = iq2s_grid[index];
        return signed_bytes((unsigned)(g >> (32 * h)), ((unsigned)p[34 + 4 * ib + l] >> (4 * h)) & 15u);
    }
    __device__ static void scales(const u8* p, int ib, float (&d)[2]) { nibble_scales(f16_at(p), p[74 + ib], d); }
};
// IQ3_XXS {d, qs[64], aux[8] u32} per 256: values 4i..4i+3 of unit ib are grid entry qs[8 ib + i]; aux[ib]
// holds the four groups' 7 sign bits and the scale in its top 4 bits, d (0.5 + scale) / 2.
struct IQ3_XXS_S {
    static constexpr int QK = 256, BYTES = 98, ZERO = 64;
    static constexpr bool TWO_SCALES = false;
    __device__ static unsigned word(const u8* p, int ib, int i) {
        const int l = i >> 1, h = i & 1;
        const unsigned signs = signs8((word_a2(p + 66 + 4 * ib) >> (7 * l)) & 127u);
        return signed_bytes(iq3xxs_grid[p[2 + 8 * ib + i]], (signs >> (4 * h)) & 15u);
    }
    __device__ static void scales(const u8* p, int ib, float (&d)[2]) {
        d[0] = d[1] = half_step(f16_at(p), word_a2(p + 66 + 4 * ib) >> 28, 0.5f);
    }
};
// IQ3_S {d, qs[64], qh[8], signs[32], scales[4]} per 256: values 4i..4i+3 of unit ib are grid entry qs[8 ib +
// i] with bit i of qh[ib] above it, group l's signs the byte signs[4 ib + l]; the scale d (1 + 2 s), s unit
// ib's nibble of scales[ib / 2].
struct IQ3_S_S {
    static constexpr int QK = 256, BYTES = 110, ZERO = 64;
    static constexpr bool TWO_SCALES = false;
    __device__ static unsigned word(const u8* p, int ib, int i) {
        const int l = i >> 1, h = i & 1;
        const unsigned index = p[2 + 8 * ib + i] | ((((unsigned)p[66 + ib] >> i) & 1u) << 8);
        return signed_bytes(iq3s_grid[index], ((unsigned)p[74 + 4 * ib + l] >> (4 * h)) & 15u);
    }
    __device__ static void scales(const u8* p, int ib, float (&d)[2]) {
        const unsigned s = ((unsigned)p[106 + (ib >> 1)] >> (4 * (ib & 1))) & 15u;
        d[0] = d[1] = __fmul_rn(f16_at(p), (float)(1u + 2u * s));
    }
};
// IQ4_NL {d, qs[16]} per 32: value j < 16 is level (the low nibble of qs[j]), j >= 16 the high nibble of
// qs[j - 16]; d * level.
struct IQ4_NL_S {
    static constexpr int QK = 32, BYTES = 18, ZERO = 128;
    static constexpr bool TWO_SCALES = false;
    __device__ static unsigned word(const u8* p, int, int i) {
        const unsigned q = word_a2(p + 2 + 4 * (i & 3));
        return iq4_bytes(i < 4 ? q & 0x0F0F0F0Fu : (q >> 4) & 0x0F0F0F0Fu);
    }
    __device__ static void scales(const u8* p, int, float (&d)[2]) { d[0] = d[1] = f16_at(p); }
};
// IQ4_XS {d, scales_h u16, scales_l[4], qs[128]} per 256: unit ib is IQ4_NL's qs at 8 + 16 ib, scaled d (ls -
// 32), ls 6 bits: ib's nibble of scales_l[ib / 2] and bits 2 ib, 2 ib + 1 of scales_h above it.
struct IQ4_XS_S {
    static constexpr int QK = 256, BYTES = 136, ZERO = 128;
    static constexpr bool TWO_SCALES = false;
    __device__ static unsigned word(const u8* p, int ib, int i) {
        const unsigned q = word_a2(p + 8 + 16 * ib + 4 * (i & 3));
        return iq4_bytes(i < 4 ? q & 0x0F0F0F0Fu : (q >> 4) & 0x0F0F0F0Fu);
    }
    __device__ static void scales(const u8* p, int ib, float (&d)[2]) {
        const unsigned low = ((unsigned)p[4 + (ib >> 1)] >> (4 * (ib & 1))) & 15u;
        const unsigned high = ((unsigned)*reinterpret_cast<const u16*>(p + 2) >> (2 * ib)) & 3u;
        d[0] = d[1] = __fmul_rn(f16_at(p), (float)((int)(low | (high << 4)) - 32));
    }
};
using IQ2_XXS = IQ<IQ2_XXS_S>;
using IQ2_XS = IQ<IQ2_XS_S>;
using IQ2_S = IQ<IQ2_S_S>;
using IQ3_XXS = IQ<IQ3_XXS_S>;
using IQ3_S = IQ<IQ3_S_S>;
using IQ4_NL = IQ<IQ4_NL_S>;
using IQ4_XS = IQ<IQ4_XS_S>;

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
#ifdef __CUDA_ARCH__
    int r;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
#else  // the CPU's tests run this file on the host (tests/engine/kernels/cuda_host.h)
    return host_dp4a(a, b, c);
#endif
}
