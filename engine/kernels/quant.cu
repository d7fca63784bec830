// Weights in their GGUF block layout (ggml-common.h), read on the GPU. One decoder per type turns
// a "unit" of 32 consecutive values of a row (a block, or a sub-block of a K-quant super-block)
// into exact small integers q[32] and an affine pair per 16 values: value = d * q + m. F16 rows are
// a type like the others (q = the values, d = 1), so every weight kind shares the kernels:
//   dequant_<T>(src, y, units, cols)         blocks -> fp16 (rows, cols): load time with
//                                             --weights fp16, and a prompt chunk's GEMM scratch
//   embed_<T>(src, ids, y, units, cols)      rows ids[r] -> fp32 (n, cols): the token embedding
//   matvec_<T>[_f32](w, x, y, m, k)          y (m,) = W (m, k) @ x (k,) fp16, fp32 accumulation,
//                                             the blocks read directly: decode steps and the head
// NumPy reference: gguf.quants.dequantize (tools/gpu_kernels_check.py compares every type).
#include <cuda_fp16.h>

using u8 = unsigned char;
using u16 = unsigned short;

struct Unit {
    float q[32];       // exact integers (the values themselves for F16)
    float d[2], m[2];  // value j = d[j / 16] * q[j] + m[j / 16]
};

__device__ __forceinline__ float f16_at(const u8* p) { return __half2float(*reinterpret_cast<const __half*>(p)); }

// Four bytes of w (each an integer < 256) as exact floats minus offset: each byte is placed under
// the exponent of 2^23 by one byte permute (0x4B0000bb is the float 2^23 + bb), then one FADD;
// cheaper than four shifts, masks and integer-to-float conversions.
__device__ __forceinline__ void put4(float* q, unsigned w, float offset) {
#pragma unroll
    for (int j = 0; j < 4; ++j) q[j] = __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7440 + j)) - (8388608.f + offset);
}

// Bits 0..3 of b (< 16) moved to bit 4 of bytes 0..3: the fifth bits of four Q5 values.
__device__ __forceinline__ unsigned fifth_bits(unsigned b) { return ((b * 0x00204081u) & 0x01010101u) << 4; }

// WORDS little-endian 32-bit words from an address aligned to 2, 4 or 16 bytes.
template <int WORDS>
__device__ __forceinline__ void load_a2(const u8* p, unsigned (&w)[WORDS]) {
    const u16* h = reinterpret_cast<const u16*>(p);
#pragma unroll
    for (int i = 0; i < WORDS; ++i) w[i] = h[2 * i] | ((unsigned)h[2 * i + 1] << 16);
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

__device__ __forceinline__ void same_scale(Unit& u, float d, float m) { u.d[0] = u.d[1] = d, u.m[0] = u.m[1] = m; }

// Low nibbles are values 0..15 of the block, high nibbles 16..31 (plus a fifth bit from qh).
__device__ __forceinline__ void nibbles(Unit& u, const unsigned* qs, unsigned qh, float offset) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        put4(u.q + 4 * i, (qs[i] & 0x0F0F0F0Fu) | fifth_bits((qh >> (4 * i)) & 0xFu), offset);
        put4(u.q + 16 + 4 * i, ((qs[i] >> 4) & 0x0F0F0F0Fu) | fifth_bits((qh >> (16 + 4 * i)) & 0xFu), offset);
    }
}

// The 32-value formats: {d, [m], [qh[4]], qs[16]}. Q4_0: d * (q - 8); Q4_1: d * q + m; Q5_0 (the
// fifth bit of value j is bit j of qh): d * (q - 16); Q5_1: d * q + m. Fields are 2-byte aligned
// in blocks of 18 or 22 bytes, 4-byte aligned in blocks of 20 or 24.
template <int BYTES_, bool HAS_MIN, bool FIFTH_BIT>
struct Q32 {
    static constexpr int QK = 32, BYTES = BYTES_;
    static constexpr bool MIN = HAS_MIN;
    static constexpr int QH = HAS_MIN ? 4 : 2, QS = QH + (FIFTH_BIT ? 4 : 0);
    __device__ static void decode(const u8* row, int s, Unit& u) {
        const u8* p = row + s * BYTES;
        unsigned qh[1] = {0u}, qs[4];
        if (BYTES % 4 == 0) {
            if (FIFTH_BIT) load_a4(p + QH, qh);
            load_a4(p + QS, qs);
        } else {
            if (FIFTH_BIT) load_a2(p + QH, qh);
            load_a2(p + QS, qs);
        }
        nibbles(u, qs, qh[0], HAS_MIN ? 0.f : (FIFTH_BIT ? 16.f : 8.f));
        same_scale(u, f16_at(p), HAS_MIN ? f16_at(p + 2) : 0.f);
    }
};
using Q4_0 = Q32<18, false, false>;
using Q4_1 = Q32<20, true, false>;
using Q5_0 = Q32<22, false, true>;
using Q5_1 = Q32<24, true, true>;

// Q8_0 {d, qs[32] int8}: d * q
struct Q8_0 {
    static constexpr int QK = 32, BYTES = 34;
    static constexpr bool MIN = false;
    __device__ static void decode(const u8* row, int s, Unit& u) {
        const u8* p = row + s * BYTES;
        unsigned qs[8];
        load_a2(p + 2, qs);
#pragma unroll
        for (int i = 0; i < 8; ++i) put4(u.q + 4 * i, qs[i] ^ 0x80808080u, 128.f);  // two's complement + 128
        same_scale(u, f16_at(p), 0.f);
    }
};

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K super-block (scales at q).
__device__ __forceinline__ void scale_min_k4(int j, const u8* q, float* sc, float* mn) {
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// Q4_K {d, dmin, scales[12], qs[128]} and Q5_K {d, dmin, scales[12], qh[32], qs[128]} per 256
// values: sub-block sb (unit s) takes the low (even sb) or high (odd sb) nibbles of qs[32 * (sb / 2)
// ...], Q5_K's fifth bit of value l is bit sb of qh[l]; value = d * sc * q - dmin * mn with the
// sub-block's 6-bit scale and min.
template <int BYTES_, bool FIFTH_BIT>
struct K4 {
    static constexpr int QK = 256, BYTES = BYTES_;
    static constexpr bool MIN = true;
    __device__ static void decode(const u8* row, int s, Unit& u) {
        const int sb = s & 7;
        const u8* p = row + (s >> 3) * BYTES;
        unsigned qh[8] = {}, qs[8];
        if (FIFTH_BIT) load_a16(p + 16, qh);
        load_a16(p + (FIFTH_BIT ? 48 : 16) + 32 * (sb >> 1), qs);
        const int shift = (sb & 1) * 4;
#pragma unroll
        for (int i = 0; i < 8; ++i)
            put4(u.q + 4 * i, ((qs[i] >> shift) & 0x0F0F0F0Fu) | (((qh[i] >> sb) & 0x01010101u) << 4), 0.f);
        float sc, mn;
        scale_min_k4(sb, p + 4, &sc, &mn);
        same_scale(u, f16_at(p) * sc, -f16_at(p + 2) * mn);
    }
};
using Q4_K = K4<144, false>;
using Q5_K = K4<176, true>;

// Q6_K {ql[128], qh[64], scales[16] int8, d} per 256 values, two halves of 128. In half h,
// quarter k (sub-block sb = 4h + k), value l: low 4 bits from ql[64h + 32(k&1) + l] (low nibble for
// k < 2, high for k >= 2), high 2 bits from qh[32h + l] >> 2k; d * scales[8h + 2k + l/16] * (q - 32).
struct Q6_K {
    static constexpr int QK = 256, BYTES = 210;
    static constexpr bool MIN = false;
    __device__ static void decode(const u8* row, int s, Unit& u) {
        const int sb = s & 7, h = sb >> 2, k = sb & 3;
        const u8* p = row + (s >> 3) * BYTES;
        unsigned ql[8], qh[8];
        load_a2(p + 64 * h + 32 * (k & 1), ql);
        load_a2(p + 128 + 32 * h, qh);
        const int lo_shift = (k >> 1) * 4, hi_shift = 2 * k;
#pragma unroll
        for (int i = 0; i < 8; ++i)
            put4(u.q + 4 * i, ((ql[i] >> lo_shift) & 0x0F0F0F0Fu) | (((qh[i] >> hi_shift) & 0x03030303u) << 4), 32.f);
        const signed char* scales = reinterpret_cast<const signed char*>(p + 192 + 8 * h + 2 * k);
        const float d = f16_at(p + 208);
        u.d[0] = d * scales[0], u.d[1] = d * scales[1], u.m[0] = u.m[1] = 0.f;
    }
};

// F16 rows: 32 values of 2 bytes.
struct F16 {
    static constexpr int QK = 32, BYTES = 64;
    static constexpr bool MIN = false;
    __device__ static void decode(const u8* row, int s, Unit& u) {
        unsigned w[16];
        load_a16(row + s * BYTES, w);
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w[i]));
            u.q[2 * i] = f.x, u.q[2 * i + 1] = f.y;
        }
        same_scale(u, 1.f, 0.f);
    }
};

template <class T>
__device__ __forceinline__ size_t row_bytes(int cols) { return (size_t)(cols / T::QK) * T::BYTES; }

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

// One thread per unit: out row r = source row ids[r] (or r), values [32 s, 32 s + 32).
template <class T, typename Out>
__device__ __forceinline__ void dequant_rows(const u8* __restrict__ src, const long long* __restrict__ ids,
                                             Out* __restrict__ y, long long units, int cols) {
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= units) return;
    const int per_row = cols / 32, s = (int)(i % per_row);
    const long long r = i / per_row, src_row = ids ? ids[r] : r;
    Unit u;
    T::decode(src + src_row * row_bytes<T>(cols), s, u);
    float v[32];
#pragma unroll
    for (int j = 0; j < 32; ++j) v[j] = fmaf(u.d[j >> 4], u.q[j], u.m[j >> 4]);
    store32(y + r * cols + s * 32, v);
}

__device__ __forceinline__ void store(float* y, int i, float v) { y[i] = v; }
__device__ __forceinline__ void store(__half* y, int i, float v) { y[i] = __float2half(v); }

#ifndef MV_WARPS
#define MV_WARPS 4  // warps per block
#endif
#ifndef MV_ROWS
#define MV_ROWS 2  // rows per warp: each x unit loaded once serves them all
#endif

// Each lane takes units lane, lane + 32, ... of the warp's rows: adjacent lanes read adjacent
// blocks, so a warp's loads are contiguous runs of the row.
template <class T, typename Out>
__device__ __forceinline__ void matvec(const u8* __restrict__ w, const __half* __restrict__ x, Out* __restrict__ y,
                                       int m, int k) {
    const int lane = threadIdx.x & 31;
    const int row0 = (blockIdx.x * MV_WARPS + (threadIdx.x >> 5)) * MV_ROWS;
    if (row0 >= m) return;
    const size_t rb = row_bytes<T>(k);
    const int units = k / 32;
    float acc[MV_ROWS] = {};
    for (int s = lane; s < units; s += 32) {
        float xv[32];
        const uint4* xp = reinterpret_cast<const uint4*>(x + s * 32);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint4 v = xp[i];
            const __half2* h = reinterpret_cast<const __half2*>(&v);
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const float2 f = __half22float2(h[j]);
                xv[8 * i + 2 * j] = f.x, xv[8 * i + 2 * j + 1] = f.y;
            }
        }
        float xs0 = 0.f, xs1 = 0.f;  // the block sums an offset m multiplies
        if (T::MIN) {
#pragma unroll
            for (int j = 0; j < 16; ++j) xs0 += xv[j], xs1 += xv[j + 16];
        }
#pragma unroll
        for (int r = 0; r < MV_ROWS; ++r) {
            if (row0 + r >= m) break;
            Unit u;
            T::decode(w + (row0 + r) * rb, s, u);
            float s0 = 0.f, s1 = 0.f;
#pragma unroll
            for (int j = 0; j < 16; ++j) s0 = fmaf(u.q[j], xv[j], s0), s1 = fmaf(u.q[j + 16], xv[j + 16], s1);
            acc[r] += u.d[0] * s0 + u.d[1] * s1;
            if (T::MIN) acc[r] += u.m[0] * xs0 + u.m[1] * xs1;
        }
    }
#pragma unroll
    for (int r = 0; r < MV_ROWS; ++r) {
        float a = acc[r];
        for (int o = 16; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
        if (lane == 0 && row0 + r < m) store(y, row0 + r, a);
    }
}

#define WEIGHT_KERNELS(T)                                                                                       \
    extern "C" __global__ void dequant_##T(const u8* src, __half* y, long long units, int cols) {              \
        dequant_rows<T>(src, nullptr, y, units, cols);                                                          \
    }                                                                                                           \
    extern "C" __global__ void embed_##T(const u8* src, const long long* ids, float* y, long long units,       \
                                         int cols) {                                                            \
        dequant_rows<T>(src, ids, y, units, cols);                                                              \
    }                                                                                                           \
    extern "C" __global__ void __launch_bounds__(MV_WARPS * 32)                                                 \
        matvec_##T(const u8* w, const __half* x, __half* y, int m, int k) { matvec<T>(w, x, y, m, k); }         \
    extern "C" __global__ void __launch_bounds__(MV_WARPS * 32)                                                 \
        matvec_##T##_f32(const u8* w, const __half* x, float* y, int m, int k) { matvec<T>(w, x, y, m, k); }

WEIGHT_KERNELS(Q4_0)
WEIGHT_KERNELS(Q4_1)
WEIGHT_KERNELS(Q5_0)
WEIGHT_KERNELS(Q5_1)
WEIGHT_KERNELS(Q8_0)
WEIGHT_KERNELS(Q4_K)
WEIGHT_KERNELS(Q5_K)
WEIGHT_KERNELS(Q6_K)
WEIGHT_KERNELS(F16)

// BF16 -> fp16 at load (a bf16 is the high half of an fp32). n = values.
extern "C" __global__ void dequant_BF16(const unsigned short* __restrict__ src, __half* __restrict__ y, long long n) {
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = __float2half(__uint_as_float((unsigned)src[i] << 16));
}
