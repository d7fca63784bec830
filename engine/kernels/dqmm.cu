// Quantized weights against a decode batch on the fp16 tensor cores, batch-invariant (issue 48's probe):
//   dqmm_<T>_t<NT>[_f32](w, x, y, m, k, ldy, nb)
//     y (nb, m; rows ldy apart) = x (nb, k; fp16) @ W (m, k)^T, W in its GGUF blocks (quant_blocks.cuh) decoded to
//     fp16 in registers, fp32 accumulation in the mma's accumulators, nb <= 8 NT (NT = 1, 2, 4, 8).
//
// Where mmq.cu meets 8-bit rows of x with the dp4a matvec's order (a float step for every weight row, x row and
// unit of 32, added into 32 chains: the instructions that bound it at 64 rows, bench/HISTORY.md), this kernel
// decodes each weight once into the A fragment of an m16n8k16 mma and lets the tensor cores add the products of
// every x row in their accumulators: per (16 weight rows, unit) a lane decodes 16 values whatever the batch, and
// each 8 rows of x cost two mmas. x stays in fp16 (no 8-bit rounding of the activations).
// Not dispatched by the engine (engine/kernels/loader.py does not load it): on an H100 its rows were exact and ten
// times closer to the exact product than today's, and slower at one row (the decode of every weight to fp16) and
// no faster at 64 (x from L2 for every 32 weight rows): bench/HISTORY.md, twenty-fifth session. Kept, with
// tools/device/dqmm_check.py, as the measured record of the route and its starting point.
//
// The order, mmv.cu's: a group of DQ_WARPS warps (a block holds DQ_WIDE_R groups at wide batches) owns 16 G
// weight rows; warp w of it takes units w, w + DQ_WARPS, ... (a unit: 32 values of a row, two mmas, its first
// half then its second) into its accumulators, then the warps' partials are added in warp order. A column of an
// mma's output depends on that column of B (and of the accumulator) alone, so x's row b gets the same bits among
// 1 or 64 rows, beside zeros or other rows; nothing depends on nb, NT, G or the groups. Solo decode would run
// this kernel too (nb = 1, one n-tile).
//
// Fragments: lane (g, c) = (lane / 4, lane % 4) takes of each unit what T::pair gives it, the bytes of values
// 4c .. 4c + 3 of each half (lo: the first 16, hi: the second) of rows g and g + 8, as halves d * byte + m. The
// mma's k slots 2c, 2c + 1, 2c + 8, 2c + 9 hold those four values, and B's the same four values of x's row g
// (one 8-byte load): each mma sums the products of matching positions, a permutation of the half-unit's k.
// NumPy reference: x @ dequantize(W).T (tools/device/dqmm_check.py).
#include "quant_blocks.cuh"
#include "mma.cuh"
#include "pdl.cuh"

#ifndef DQ_WARPS
#define DQ_WARPS 4  // warps splitting a row's units (the order's one knob: it changes bits, not the batch's)
#endif
#ifndef DQ_UNROLL
#define DQ_UNROLL 8  // units a warp has in flight at 1 and 2 n-tiles
#endif
#ifndef DQ_WIDE_G
#define DQ_WIDE_G 2  // 16-row weight tiles a warp takes at 4 and 8 n-tiles (x's loads shared by G tiles)
#endif
#ifndef DQ_WIDE_R
#define DQ_WIDE_R 1  // groups of DQ_WARPS warps a block, each its own G tiles, at 4 and 8 n-tiles (x's loads met in L1)
#endif

template <int NT>
__host__ __device__ constexpr int dqmm_tiles() { return NT >= 4 ? DQ_WIDE_G : 1; }
template <int NT>
__host__ __device__ constexpr int dqmm_groups() { return NT >= 4 ? DQ_WIDE_R : 1; }

__device__ __forceinline__ void dq_store(float* y, size_t i, float v) { y[i] = v; }
__device__ __forceinline__ void dq_store(__half* y, size_t i, float v) { y[i] = __float2half(v); }

// Four unsigned bytes (values 0..3) as halves d * byte + m: values 0, 1 in lo2, 2, 3 in hi2 (low half first).
// The bytes become 1024 + byte exactly (0x64 above them), 1024 comes off exactly, then one rounding of d byte + m.
__device__ __forceinline__ void bytes_as_halves(unsigned q, __half2 d, __half2 m, unsigned& lo2, unsigned& hi2) {
    const __half2 k1024 = __half2half2(__ushort_as_half((unsigned short)0x6400));
    const unsigned a = __byte_perm(q, 0x64646464u, 0x4140), b = __byte_perm(q, 0x64646464u, 0x4342);
    const __half2 va = __hfma2(__hsub2(*reinterpret_cast<const __half2*>(&a), k1024), d, m);
    const __half2 vb = __hfma2(__hsub2(*reinterpret_cast<const __half2*>(&b), k1024), d, m);
    lo2 = *reinterpret_cast<const unsigned*>(&va), hi2 = *reinterpret_cast<const unsigned*>(&vb);
}

// A unit of rows g and g + 8 (pa, pb) as the A fragments of its two mmas (a0: the first half, a1: the second).
__device__ __forceinline__ void unit_fragments(const Pair& pa, const Pair& pb, uint32_t (&a0)[4], uint32_t (&a1)[4]) {
    bytes_as_halves(pa.lo, __float2half2_rn(pa.d[0]), __float2half2_rn(pa.m[0]), a0[0], a0[2]);
    bytes_as_halves(pb.lo, __float2half2_rn(pb.d[0]), __float2half2_rn(pb.m[0]), a0[1], a0[3]);
    bytes_as_halves(pa.hi, __float2half2_rn(pa.d[1]), __float2half2_rn(pa.m[1]), a1[0], a1[2]);
    bytes_as_halves(pb.hi, __float2half2_rn(pb.d[1]), __float2half2_rn(pb.m[1]), a1[1], a1[3]);
}

// Units a warp has in flight a round (their loads first, then their mmas in unit order): fewer as the n-tiles
// grow (each holds NT fragments of x). The round groups loads only: no bit depends on it.
template <int NT>
__host__ __device__ constexpr int dqmm_unroll() { return NT >= 8 ? 2 : NT >= 4 ? 4 : DQ_UNROLL; }

template <class T, int NT, typename Out>
__device__ __forceinline__ void dqmm(const u8* __restrict__ w, const __half* __restrict__ x, Out* __restrict__ y,
                                     int m, int k, int ldy, int nb) {
    constexpr int G = dqmm_tiles<NT>(), U = dqmm_unroll<NT>(), P = G * NT;  // P: (tile, n-tile) outputs a lane
    constexpr int GR = dqmm_groups<NT>(), SR = 32 / (DQ_WARPS * GR) > 1 ? 32 / (DQ_WARPS * GR) : 1;
    constexpr int R = SR < P ? SR : P;  // of the P outputs, those summed across warps a round
    __shared__ float partial[GR][DQ_WARPS][R][32][4];
    const int group = threadIdx.x / (32 * DQ_WARPS), warp = (threadIdx.x >> 5) % DQ_WARPS, lane = threadIdx.x & 31;
    const int g = lane >> 2, c = lane & 3;
    const int row0 = (blockIdx.x * GR + group) * 16 * G, units = k >> 5;
    const size_t rb = row_bytes<T>(k);
    after_producer();
    const u8 *ra[G], *rb8[G];  // tile j's rows row0 + 16 j + g and + 8 (row 0 past the matrix: computed, not stored)
#pragma unroll
    for (int j = 0; j < G; ++j) {
        const int r = row0 + 16 * j + g;
        ra[j] = w + (size_t)(r < m ? r : 0) * rb;
        rb8[j] = w + (size_t)(r + 8 < m ? r + 8 : 0) * rb;
    }
    const __half* xs[NT];
    bool has[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) {
        has[t] = 8 * t + g < nb;
        xs[t] = x + (size_t)(has[t] ? 8 * t + g : 0) * k + 4 * c;
    }
    float acc[G][NT][4];
#pragma unroll
    for (int j = 0; j < G; ++j)
#pragma unroll
        for (int t = 0; t < NT; ++t) acc[j][t][0] = acc[j][t][1] = acc[j][t][2] = acc[j][t][3] = 0.f;

    for (int base = warp; base < units; base += DQ_WARPS * U) {
        Pair pa[U][G], pb[U][G];
        uint2 xlo[U][NT], xhi[U][NT];
#pragma unroll
        for (int u = 0; u < U; ++u) {  // the round's loads (a unit past the row reads the round's first again)
            const int s = base + u * DQ_WARPS < units ? base + u * DQ_WARPS : base;
#pragma unroll
            for (int j = 0; j < G; ++j) T::pair(ra[j], s, c, pa[u][j]), T::pair(rb8[j], s, c, pb[u][j]);
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                const uint2 zero = {0u, 0u};
                xlo[u][t] = has[t] ? __ldg(reinterpret_cast<const uint2*>(xs[t] + 32 * s)) : zero;
                xhi[u][t] = has[t] ? __ldg(reinterpret_cast<const uint2*>(xs[t] + 32 * s + 16)) : zero;
            }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {  // then the mmas, in unit order
            if (base + u * DQ_WARPS >= units) break;
#pragma unroll
            for (int j = 0; j < G; ++j) {
                uint32_t a0[4], a1[4];
                unit_fragments(pa[u][j], pb[u][j], a0, a1);
#pragma unroll
                for (int t = 0; t < NT; ++t) {
                    mma_16x8x16(acc[j][t], a0, xlo[u][t].x, xlo[u][t].y);
                    mma_16x8x16(acc[j][t], a1, xhi[u][t].x, xhi[u][t].y);
                }
            }
        }
    }
    // The warps' partials added in warp order, R outputs a round through shared memory; warp q % DQ_WARPS adds
    // output q of the round. Accumulator i of output p = (j, t): row g + 8 (i / 2), column 2c + i % 2.
#pragma unroll
    for (int p0 = 0; p0 < P; p0 += R) {
#pragma unroll
        for (int q = 0; q < R; ++q)
#pragma unroll
            for (int i = 0; i < 4; ++i)
                if (p0 + q < P) partial[group][warp][q][lane][i] = (&acc[0][0][0])[4 * (p0 + q) + i];
        __syncthreads();
#pragma unroll
        for (int q = warp; q < R; q += DQ_WARPS) {
            const int p = p0 + q, j = p / NT, t = p % NT;
            if (p >= P) break;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                float sum = partial[group][0][q][lane][i];
#pragma unroll
                for (int v = 1; v < DQ_WARPS; ++v) sum = __fadd_rn(sum, partial[group][v][q][lane][i]);
                const int col = 8 * t + 2 * c + (i & 1), row = row0 + 16 * j + g + 8 * (i >> 1);
                if (col < nb && row < m) dq_store(y, (size_t)col * ldy + row, sum);
            }
        }
        __syncthreads();  // read before the next round writes
    }
}

#define DQMM_NT(T, NT)                                                                                              \
    extern "C" __global__ void __launch_bounds__(DQ_WARPS * 32 * (NT >= 4 ? DQ_WIDE_R : 1))                         \
        dqmm_##T##_t##NT(const u8* w, const __half* x, __half* y, int m, int k, int ldy, int nb) {                  \
        dqmm<T, NT>(w, x, y, m, k, ldy, nb);                                                                        \
    }                                                                                                               \
    extern "C" __global__ void __launch_bounds__(DQ_WARPS * 32 * (NT >= 4 ? DQ_WIDE_R : 1))                         \
        dqmm_##T##_t##NT##_f32(const u8* w, const __half* x, float* y, int m, int k, int ldy, int nb) {             \
        dqmm<T, NT>(w, x, y, m, k, ldy, nb);                                                                        \
    }
#define DQMM(T) DQMM_NT(T, 1) DQMM_NT(T, 2) DQMM_NT(T, 4) DQMM_NT(T, 8)

DQMM(Q4_K)
DQMM(Q6_K)
DQMM(Q8_0)
