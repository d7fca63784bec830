// Quantized weights against a decode batch on the int8 tensor cores, batch-invariant:
//   mmq_<T>_t<NT>[_f32](w, xq, y, m, k, ldy, nb)
//     y (nb, m; rows ldy apart) = x (nb, k) @ W (m, k)^T: W in its GGUF blocks (blocks.cuh), x as
//     Q8 units (q8.cuh; row b's units start at xq + b * k / 32), nb <= 8 NT.
//
// Each unit of 32 values splits into its two halves of 16 (the K-quants' scales change every 16
// values in Q6_K): per half, one mma.sync m16n8k16 u8 x s8 -> s32 gives the exact integer dot
// products of 16 weight rows' unsigned bytes with 8 rows of x's int8 quants. Those two integers
// per (weight row, x row) then become the unit's contribution in floats, rounded as written:
//   dx * (d0 s0 + d1 s1) + (m0 sx0 + m1 sx1)
// (d, m: the weights' affine pair per half; dx, sx: x's scale and half sums; matvec.cuh's formula).
//
// Order, fixed by k alone: warp p of the block's MMQ_PHASES takes units p, p + PHASES, ... in turn,
// adding each unit's contribution to one running sum per output; warp 0 then adds the other
// warps' sums to its own in warp order. Nothing in that order depends on how many rows of x sit
// beside a row, on which weight rows a block tiles, or on NT: a column of an mma's output depends
// only on that column of B, so x's row b gives the very same bits alone and among 63 others. Solo
// decode runs this kernel too (nb = 1).
//
// Fragments (PTX's m16n8k16 integer layout), lane (g, c) = (lane / 4, lane % 4): A holds weight
// rows g and g + 8, bytes 4c..4c+3 of the half (one word each: Pair's lo for half 0, hi for half
// 1); B holds x's row g, the same bytes; the output holds rows g and g + 8 for x's rows 2c, 2c + 1.
// A block tiles MT x 16 weight rows against NT x 8 rows of x, so a weight unit is decoded once per
// block and serves every row of x. NumPy reference: dequantize(W) @ quantize_q8(x)
// (tools/gpu_kernels_check.py, tools/mmq_check.py).
#include "blocks.cuh"

#ifndef MMQ_PHASES
#define MMQ_PHASES 4  // warps per block, each a phase of the units (MMQ_THREADS / 32 in engine/kernels/__init__.py)
#endif

__device__ __forceinline__ void mma_u8s8(int* c, unsigned a0, unsigned a1, unsigned b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(b));
}

__device__ __forceinline__ void put(float* y, size_t i, float v) { y[i] = v; }
__device__ __forceinline__ void put(__half* y, size_t i, float v) { y[i] = __float2half(v); }

// One unit's contribution to output (weight row r, x row b), in matvec.cuh's rounding.
__device__ __forceinline__ float unit_value(const Pair& w, const float4& x, int s0, int s1) {
    const float dot = __fmaf_rn(w.d[1], (float)s1, __fmul_rn(w.d[0], (float)s0));
    const float off = __fmaf_rn(w.m[1], x.z, __fmul_rn(w.m[0], x.y));
    return __fmaf_rn(x.x, dot, off);
}

template <class T, int MT, int NT, typename Out>
__device__ __forceinline__ void mmq(const u8* __restrict__ w, const Q8* __restrict__ xq, Out* __restrict__ y, int m,
                                    int k, int ldy, int nb) {
    __shared__ float4 partial[MMQ_PHASES - 1][MT * NT][32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int row0 = blockIdx.x * 16 * MT, units = k >> 5;
    const size_t rb = row_bytes<T>(k);
    const u8* wr[MT][2];  // this lane's weight rows: 16 mt + g and 16 mt + g + 8
    bool wv[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = row0 + 16 * mt + 8 * h + g;
            wv[mt][h] = r < m;
            wr[mt][h] = w + (size_t)(wv[mt][h] ? r : 0) * rb;
        }
    // x's rows this lane reads: 8 nt + g (its B fragment), 8 nt + 2c and + 1 (its outputs' scales)
    const Q8* xb = xq + (size_t)g * units;
    const Q8* xs = xq + (size_t)(2 * c) * units;
    float acc[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.f;

#pragma unroll 2
    for (int s = warp; s < units; s += MMQ_PHASES) {
        Pair a[MT][2];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                if (wv[mt][h]) {
                    T::pair(wr[mt][h], s, c, a[mt][h]);
                } else {
                    a[mt][h].lo = a[mt][h].hi = 0u;
                    same_scale(a[mt][h], 0.f, 0.f);
                }
            }
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            if (8 * nt >= nb) break;  // the whole tile is past the batch (uniform across the warp)
            const bool b_in = 8 * nt + g < nb, x0_in = 8 * nt + 2 * c < nb, x1_in = 8 * nt + 2 * c + 1 < nb;
            const int* q = reinterpret_cast<const int*>(xb + (size_t)8 * nt * units + s);
            const unsigned blo = b_in ? q[c] : 0u, bhi = b_in ? q[4 + c] : 0u;
            const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
            const Q8* xr = xs + (size_t)8 * nt * units + s;
            const float4 x0 = x0_in ? *reinterpret_cast<const float4*>(&xr->d) : zero;
            const float4 x1 = x1_in ? *reinterpret_cast<const float4*>(&xr[units].d) : zero;
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                int s0[4] = {0, 0, 0, 0}, s1[4] = {0, 0, 0, 0};
                mma_u8s8(s0, a[mt][0].lo, a[mt][1].lo, blo);
                mma_u8s8(s1, a[mt][0].hi, a[mt][1].hi, bhi);
#pragma unroll
                for (int i = 0; i < 4; ++i)  // (row g, x rows 2c, 2c + 1), (row g + 8, the same)
                    acc[mt][nt][i] = __fadd_rn(acc[mt][nt][i], unit_value(a[mt][i >> 1], i & 1 ? x1 : x0, s0[i], s1[i]));
            }
        }
    }
    if (warp != 0) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
                partial[warp - 1][mt * NT + nt][lane] = make_float4(acc[mt][nt][0], acc[mt][nt][1], acc[mt][nt][2], acc[mt][nt][3]);
    }
    __syncthreads();
    if (warp != 0) return;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            float sum[4] = {acc[mt][nt][0], acc[mt][nt][1], acc[mt][nt][2], acc[mt][nt][3]};
#pragma unroll
            for (int v = 0; v < MMQ_PHASES - 1; ++v) {
                const float4 p = partial[v][mt * NT + nt][lane];
                sum[0] = __fadd_rn(sum[0], p.x), sum[1] = __fadd_rn(sum[1], p.y);
                sum[2] = __fadd_rn(sum[2], p.z), sum[3] = __fadd_rn(sum[3], p.w);
            }
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int row = row0 + 16 * mt + g + 8 * (i >> 1), col = 8 * nt + 2 * c + (i & 1);
                if (row < m && col < nb) put(y, (size_t)col * ldy + row, sum[i]);
            }
        }
}

// NT n-tiles of 8 rows of x; MT (16 weight rows each) grows with NT so that a wide batch decodes
// each weight unit once for more rows of x, and a narrow one keeps many blocks in flight.
#define MMQ_NT(T, NT, MT)                                                                                           \
    extern "C" __global__ void __launch_bounds__(MMQ_PHASES * 32)                                                   \
        mmq_##T##_t##NT(const u8* w, const Q8* xq, __half* y, int m, int k, int ldy, int nb) {                      \
        mmq<T, MT, NT>(w, xq, y, m, k, ldy, nb);                                                                    \
    }                                                                                                               \
    extern "C" __global__ void __launch_bounds__(MMQ_PHASES * 32)                                                   \
        mmq_##T##_t##NT##_f32(const u8* w, const Q8* xq, float* y, int m, int k, int ldy, int nb) {                 \
        mmq<T, MT, NT>(w, xq, y, m, k, ldy, nb);                                                                    \
    }
#ifndef MMQ_WIDE_MT
#define MMQ_WIDE_MT 2  // weight tiles a block takes at 4 and 8 n-tiles: a knob for tools/mmq_check.py
#endif
#define MMQ(T) MMQ_NT(T, 1, 1) MMQ_NT(T, 2, 1) MMQ_NT(T, 4, MMQ_WIDE_MT) MMQ_NT(T, 8, MMQ_WIDE_MT)

MMQ(Q4_0)
MMQ(Q4_1)
MMQ(Q5_0)
MMQ(Q5_1)
MMQ(Q8_0)
MMQ(Q4_K)
MMQ(Q5_K)
MMQ(Q6_K)
