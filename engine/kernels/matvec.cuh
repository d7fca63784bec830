// Matrix-vector products over rows of weights, shared by quant.cu (a whole matrix: decode steps,
// the head) and moe.cu (the chosen experts' rows). A warp owns MV_ROWS consecutive rows; each lane
// takes units lane, lane + 32, ... of them, so adjacent lanes read adjacent blocks and a warp's
// loads are contiguous runs of a row. The dot products accumulate into per-lane partials, summed
// across the warp by reduce_store.
#pragma once
#include "quant_blocks.cuh"

#ifndef MV_WARPS
#define MV_WARPS 4  // warps per block
#endif
#ifndef MV_ROWS
#define MV_ROWS 2  // rows per warp: each x unit loaded once serves them all
#endif
#ifndef MV_UNROLL
#define MV_UNROLL 1  // units a lane has in flight per row (the unit loop's unrolling)
#endif
constexpr int kMvUnroll = MV_UNROLL;

__device__ __forceinline__ void store(float* y, size_t i, float v) { y[i] = v; }
__device__ __forceinline__ void store(__half* y, size_t i, float v) { y[i] = __float2half(v); }

// The first row this warp owns (R rows a warp) in the block-th block of a matrix's grid.
template <int R = MV_ROWS>
__device__ __forceinline__ int warp_row0(int block = -1) {
    return ((block < 0 ? blockIdx.x : block) * MV_WARPS + (threadIdx.x >> 5)) * R;
}

// A row's lane partials summed across the warp (every lane gets the total): reduce_store's sum.
__device__ __forceinline__ float warp_total(float a) {
    for (int o = 16; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
    return a;
}

template <typename Out>
__device__ __forceinline__ void reduce_store(float (&acc)[MV_ROWS], Out* y, int row0, int m) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < MV_ROWS; ++r) {
        const float a = warp_total(acc[r]);
        if (lane == 0 && row0 + r < m) store(y, row0 + r, a);
    }
}

// Unit s of rows row0 .. row0 + MV_ROWS (of m) of W (blocks of type T, rows rb bytes apart) against
// x's unit xu in 8 bits: acc[r] += scale * the unit's dot product (8 dp4a; the Q8 unit carries d and
// its halves' sums, which the weights' offsets multiply).
template <class T>
__device__ __forceinline__ void unit_dot_q8(const u8* __restrict__ w, size_t rb, int row0, int m, int s,
                                            const Q8* __restrict__ xu, float scale, float (&acc)[MV_ROWS]) {
    const int4* xp = reinterpret_cast<const int4*>(xu);
    const int4 a = xp[0], b = xp[1];
    const float4 ds = *reinterpret_cast<const float4*>(xp + 2);  // d, s0, s1, s01
    const int xw[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
    for (int r = 0; r < MV_ROWS; ++r) {
        if (row0 + r >= m) break;
        Raw u;
        T::decode(w + (row0 + r) * rb, s, u);
        int s0 = 0, s1 = 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) s0 = dp4a(u.w[i], xw[i], s0), s1 = dp4a(u.w[4 + i], xw[4 + i], s1);
        acc[r] += scale * (ds.x * (u.d[0] * (float)s0 + u.d[1] * (float)s1) + u.m[0] * ds.y + u.m[1] * ds.z);
    }
}

// The same for fp16 rows (k values each) against 32 fp16 values of x.
__device__ __forceinline__ void unit_dot_f16(const __half* __restrict__ w, int k, int row0, int m, int s,
                                             const __half* __restrict__ xu, float scale, float (&acc)[MV_ROWS]) {
    float xv[32];
    load_half32(xu, xv);
#pragma unroll
    for (int r = 0; r < MV_ROWS; ++r) {
        if (row0 + r >= m) break;
        float wv[32];
        load_half32(w + (size_t)(row0 + r) * k + s * 32, wv);
        float s0 = 0.f, s1 = 0.f;
#pragma unroll
        for (int j = 0; j < 16; ++j) s0 = fmaf(wv[j], xv[j], s0), s1 = fmaf(wv[j + 16], xv[j + 16], s1);
        acc[r] += scale * (s0 + s1);
    }
}

// Rows row0 .. row0 + MV_ROWS of W . x in 8 bits: acc[r] += this lane's share (units lane, lane + 32, ...).
// U: units a lane has in flight (the loop's unrolling).
template <class T, int U = kMvUnroll>
__device__ __forceinline__ void rows_dot_q8(const u8* __restrict__ w, const Q8* __restrict__ xq, int row0, int m,
                                            int k, float (&acc)[MV_ROWS]) {
    const size_t rb = row_bytes<T>(k);
#pragma unroll U
    for (int s = threadIdx.x & 31; s < k / 32; s += 32) unit_dot_q8<T>(w, rb, row0, m, s, xq + s, 1.f, acc);
}

// The same for fp16 rows against fp16 x, fp32 accumulation: memory-bound at ~4.1 TB/s as it is.
template <int U = kMvUnroll>
__device__ __forceinline__ void rows_dot_f16(const __half* __restrict__ w, const __half* __restrict__ x, int row0,
                                             int m, int k, float (&acc)[MV_ROWS]) {
#pragma unroll U
    for (int s = threadIdx.x & 31; s < k / 32; s += 32) unit_dot_f16(w, k, row0, m, s, x + s * 32, 1.f, acc);
}

// ---- a decode batch: NB activation rows against the same weight rows, the weights read once ----
// Batch-invariant by construction: row b's dot product with weight row r is the very sum, in the
// very order, whatever NB is (lane partials over units lane, lane + 32, ..., then the warp's xor
// reduction), and every operation of it is an explicitly rounded intrinsic (__fmaf_rn, __fadd_rn,
// ...), which the compiler may neither fuse nor reorder, so no instantiation rounds differently: a
// request's logits do not depend on what is decoded beside it. The rows of x are `units` Q8 units
// (or k fp16 values) apart; y's rows are ldy apart (y holds NB rows of a wider output when W is one
// part of a stacked matrix). A warp owns R weight rows (each x unit it loads serves R of them);
// R changes which rows a warp reduces, never the order in which a row is reduced.
template <int NB, int R>
using BatchAcc = float[NB][R];

// A chain's lane partials summed across the warp (every lane gets the total), each step rounded as written.
__device__ __forceinline__ float warp_total_rn(float a) {
    for (int o = 16; o > 0; o >>= 1) a = __fadd_rn(a, __shfl_xor_sync(0xffffffffu, a, o));
    return a;
}

template <int NB, int R, typename Out>
__device__ __forceinline__ void reduce_store_batch(BatchAcc<NB, R>& acc, Out* y, int row0, int m, int ldy) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int b = 0; b < NB; ++b)
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const float a = warp_total_rn(acc[b][r]);
            if (lane == 0 && row0 + r < m) store(y + (size_t)b * ldy, row0 + r, a);
        }
}

// One unit of (weight row, x row) added to a chain's partial acc, from the unit's integer dot
// products (exact floats). w: the unit's affine pairs (a Raw or a Pair), x: x's unit {d, sx0, sx1,
// sx01}. One scale a unit (every kind but Q6_K), s the whole unit's dot product of the bytes:
//   acc + dx * (d s) + m sx01              as fma(dx, d s, fma(m, sx01, acc))
// Two (Q6_K: a scale every 16 values, its zero at byte T::ZERO, m = -ZERO d), s0 and s1 the halves'
// dot products of the centered bytes q - ZERO (the offsets folded into the integers):
//   acc + dx * (d0 s0 + d1 s1)             as fma(dx, fma(d1, s1, d0 s0), acc)
// Each step is rounded as written: the batch kernels below and mmq.cu (the same sums on the tensor
// cores) must agree bit for bit.
template <class U>
__device__ __forceinline__ float unit_add(float acc, const U& w, const float4& x, float s) {
    return __fmaf_rn(x.x, __fmul_rn(w.d[0], s), __fmaf_rn(w.m[0], x.w, acc));
}
template <class U>
__device__ __forceinline__ float unit_add(float acc, const U& w, const float4& x, float s0, float s1) {
    return __fmaf_rn(x.x, __fmaf_rn(w.d[1], s1, __fmul_rn(w.d[0], s0)), acc);
}

// A warp's R weight rows: rows row0 .. row0 + R of one matrix (rows rb bytes apart), those from m on absent.
struct RowRun {
    const u8* w;
    size_t rb;
    int row0, m;
    __device__ __forceinline__ bool has(int r) const { return row0 + r < m; }
    __device__ __forceinline__ const u8* at(int r) const { return w + (row0 + r) * rb; }
};

// Rows of two matrices side by side: rows row0 .. row0 + HALF of A, then the same rows of B (a gate's rows
// and the up rows of the same columns: quant.cu's matvec_act, whose warp multiplies each pair's products).
template <int HALF>
struct RowPairs {
    const u8* a;
    const u8* b;
    size_t rb;
    int row0;
    __device__ __forceinline__ bool has(int) const { return true; }
    __device__ __forceinline__ const u8* at(int r) const {
        return r < HALF ? a + (row0 + r) * rb : b + (row0 + r - HALF) * rb;
    }
};

// Weight rows (a RowRun or RowPairs) . x_b for NB rows x_b in 8 bits, blocks of type T: each weight unit
// is decoded once and serves every row of the batch.
template <class T, int NB, int R, class Rows>
__device__ __forceinline__ void rows_dot_q8_rows(const Rows& rows, const Q8* __restrict__ xq, int k,
                                                 BatchAcc<NB, R>& acc) {
    const int units = k / 32;
#pragma unroll 1
    for (int s = threadIdx.x & 31; s < units; s += 32) {
        Raw u[R];
#pragma unroll
        for (int r = 0; r < R; ++r)
            if (rows.has(r)) T::decode(rows.at(r), s, u[r]);
#pragma unroll
        for (int b = 0; b < NB; ++b) {
            const int4* xp = reinterpret_cast<const int4*>(xq + (size_t)b * units + s);
            const int4 xa = xp[0], xb = xp[1];
            const float4 ds = *reinterpret_cast<const float4*>(xp + 2);  // d, s0, s1, s01
            const int xw[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
            int z0 = 0, z1 = 0;  // two scales: the halves' sums of x's quants, which the zero byte multiplies
            if constexpr (T::TWO_SCALES) {
#pragma unroll
                for (int i = 0; i < 4; ++i) z0 = dp4a(0x01010101u, xw[i], z0), z1 = dp4a(0x01010101u, xw[4 + i], z1);
            }
#pragma unroll
            for (int r = 0; r < R; ++r) {
                if (!rows.has(r)) break;
                int s0 = 0, s1 = 0;
#pragma unroll
                for (int i = 0; i < 4; ++i) s0 = dp4a(u[r].w[i], xw[i], s0), s1 = dp4a(u[r].w[4 + i], xw[4 + i], s1);
                if constexpr (T::TWO_SCALES)  // the centered bytes' dot products: sum (q - ZERO) x
                    acc[b][r] = unit_add(acc[b][r], u[r], ds, (float)(s0 - T::ZERO * z0), (float)(s1 - T::ZERO * z1));
                else
                    acc[b][r] = unit_add(acc[b][r], u[r], ds, (float)(s0 + s1));
            }
        }
    }
}

// Rows row0 .. row0 + R of W (blocks of type T) . x_b for NB rows x_b in 8 bits.
template <class T, int NB, int R>
__device__ __forceinline__ void rows_dot_q8_batch(const u8* __restrict__ w, const Q8* __restrict__ xq, int row0,
                                                  int m, int k, BatchAcc<NB, R>& acc) {
    rows_dot_q8_rows<T, NB, R>(RowRun{w, row_bytes<T>(k), row0, m}, xq, k, acc);
}
