// fp16 weights against a decode batch on the tensor cores, batch-invariant:
//   mmv_f16_t<NT>[_f32](w, x, y, m, k, ldy, nb)
//     y (nb, m; rows ldy apart) = x (nb, k) @ W (m, k)^T, fp16 in, fp32 accumulation, nb <= 8 NT
//     (NT = 1, 2, 4, 8: a decode batch of up to 64 rows reads the weights once).
//
// A block (MMV_WARPS warps) owns 16 rows of W (16 G for a wide batch: mmv_tiles). The k axis is
// cut in chunks of 32; warp w takes chunks w, w + MMV_WARPS, ... (so the block reads 256
// contiguous bytes of each row per round) and
// runs two mma.sync m16n8k16 per chunk and n-tile: the 16 rows as A, eight rows of x as the
// columns of B (rows past nb are zero). Then the warps' partials are summed in warp order.
//
// Why the result does not depend on the batch: a column of an mma's output depends only on that
// column of B (and of the accumulator), so x's row b gives the very same bits whether it sits
// among 1 or 16 rows, with zero columns or others beside it; the chunk order and the warps' sum
// are fixed by k alone. Solo decode runs this kernel too (nb = 1, one n-tile).
//
// The fragments come straight from global memory, 16 bytes a lane: lane (g, c) = (lane / 4,
// lane % 4) loads halves 8c .. 8c + 7 of the chunk for row g and row g + 8 (A) and for x's row g
// (B). The k slots of the two mmas are a permutation of the chunk's 32 positions (slots 2c, 2c+1,
// 2c+8, 2c+9 of the first mma are halves 8c .. 8c + 3, of the second 8c + 4 .. 8c + 7), the same
// for A and B, so each mma sums the products of matching positions: a dot product in a fixed order.
// NumPy reference: x @ W.T (tools/device/gpu_kernels_check.py).
#include "mma.cuh"
#include "pdl.cuh"

#ifndef MMV_WARPS
#define MMV_WARPS 4  // MMV_THREADS / 32 in engine/kernels/matvec_launch.py
#endif
#ifndef MMV_UNROLL
#define MMV_UNROLL 8  // chunks a warp has in flight (tools/device/mmv_check.py times the choices)
#endif

__device__ __forceinline__ void store_out(float* y, size_t i, float v) { y[i] = v; }
__device__ __forceinline__ void store_out(__half* y, size_t i, float v) { y[i] = __float2half(v); }

// Chunks in flight per round: fewer as the n-tiles grow (each holds NT x fragments in registers).
// The round's size only groups loads: the mmas still run in chunk order, so it changes no bit.
template <int NT>
__host__ __device__ constexpr int mmv_unroll() { return NT >= 8 ? 2 : NT >= 4 ? 4 : MMV_UNROLL; }

#ifndef MMV_PREFETCH
#define MMV_PREFETCH 2048  // bytes of each weight row a block asks L2 for before it waits for x (pdl.cuh)
#endif
#ifndef MMV_WIDE_G
#define MMV_WIDE_G 2  // 16-row tiles of W a block takes at 4 and 8 n-tiles: a knob for tools/device/mmv_check.py
#endif
// Tiles of 16 weight rows a block (and each of its warps) takes: a wide batch's x fragments, loaded
// once per chunk, serve G tiles (half the x traffic from L2 at G = 2); a narrow one keeps one tile
// a block, so that a solo decode has blocks enough to fill the chip. G changes which rows a warp
// multiplies, never the order in which a row's products are summed: no bit depends on it.
template <int NT>
__host__ __device__ constexpr int mmv_tiles() { return NT >= 4 ? MMV_WIDE_G : 1; }

template <int NT, typename Out>
__device__ __forceinline__ void mmv_f16(const __half* __restrict__ w, const __half* __restrict__ x, Out* __restrict__ y,
                                        int m, int k, int ldy, int nb) {
    constexpr int G = mmv_tiles<NT>(), U = mmv_unroll<NT>();
    __shared__ float partial[MMV_WARPS][G * NT][32][4];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int row0 = blockIdx.x * 16 * G, chunks = k >> 5;
    if (row0 < m)  // the first chunks of the block's weight rows on their way before x is ready (pdl.cuh)
        prefetch_rows_l2(w + (size_t)row0 * k, (size_t)k * 2, min(16 * G, m - row0), min((size_t)k * 2, (size_t)MMV_PREFETCH),
                         threadIdx.x, MMV_WARPS * 32);
    after_producer();
    const uint4 zero = {0u, 0u, 0u, 0u};
    bool ra[G], rb[G];
    const uint4 *wa[G], *wb[G];  // tile j: rows row0 + 16 j + g (wa) and + 8 (wb)
#pragma unroll
    for (int j = 0; j < G; ++j) {
        ra[j] = row0 + 16 * j + g < m, rb[j] = row0 + 16 * j + g + 8 < m;
        wa[j] = reinterpret_cast<const uint4*>(w + (size_t)(ra[j] ? row0 + 16 * j + g : 0) * k + 8 * c);
        wb[j] = reinterpret_cast<const uint4*>(w + (size_t)(rb[j] ? row0 + 16 * j + g + 8 : 0) * k + 8 * c);
    }
    const uint4* xs[NT];
    bool has[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) {
        has[t] = t * 8 + g < nb;
        xs[t] = reinterpret_cast<const uint4*>(x + (size_t)(has[t] ? t * 8 + g : 0) * k + 8 * c);
    }
    float acc[G][NT][4];
#pragma unroll
    for (int j = 0; j < G; ++j)
#pragma unroll
        for (int t = 0; t < NT; ++t) acc[j][t][0] = acc[j][t][1] = acc[j][t][2] = acc[j][t][3] = 0.f;

    for (int base = warp; base < chunks; base += MMV_WARPS * U) {
        uint4 av[U][G], bv[U][G], xv[U][NT];
#pragma unroll
        for (int u = 0; u < U; ++u) {  // every load of the round first: 16 bytes each, in flight together
            const int ch = base + u * MMV_WARPS;
            const bool in = ch < chunks;
#pragma unroll
            for (int j = 0; j < G; ++j) {
                av[u][j] = in && ra[j] ? wa[j][ch * 4] : zero;  // a chunk is 32 halves = 4 uint4 per row
                bv[u][j] = in && rb[j] ? wb[j][ch * 4] : zero;
            }
#pragma unroll
            for (int t = 0; t < NT; ++t) xv[u][t] = in && has[t] ? xs[t][ch * 4] : zero;
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {  // then the mmas, in chunk order
            if (base + u * MMV_WARPS >= chunks) break;
#pragma unroll
            for (int j = 0; j < G; ++j) {
                const uint32_t a0[4] = {av[u][j].x, bv[u][j].x, av[u][j].y, bv[u][j].y};  // halves 8c .. 8c + 3
                const uint32_t a1[4] = {av[u][j].z, bv[u][j].z, av[u][j].w, bv[u][j].w};  // halves 8c + 4 .. 8c + 7
#pragma unroll
                for (int t = 0; t < NT; ++t) {
                    mma_16x8x16(acc[j][t], a0, xv[u][t].x, xv[u][t].y);
                    mma_16x8x16(acc[j][t], a1, xv[u][t].z, xv[u][t].w);
                }
            }
        }
    }
#pragma unroll
    for (int j = 0; j < G; ++j)
#pragma unroll
        for (int t = 0; t < NT; ++t)
#pragma unroll
            for (int i = 0; i < 4; ++i) partial[warp][j * NT + t][lane][i] = acc[j][t][i];
    __syncthreads();
    if (warp != 0) return;
#pragma unroll
    for (int j = 0; j < G; ++j)
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            float sum[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                float s = partial[0][j * NT + t][lane][i];
#pragma unroll
                for (int v = 1; v < MMV_WARPS; ++v) s = __fadd_rn(s, partial[v][j * NT + t][lane][i]);
                sum[i] = s;
            }
            // accumulator layout: (row g, columns 2c, 2c + 1), (row g + 8, columns 2c, 2c + 1)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int col = t * 8 + 2 * c + (i & 1), row = row0 + 16 * j + g + (i >> 1) * 8;
                if (col < nb && row < m) store_out(y, (size_t)col * ldy + row, sum[i]);
            }
        }
}

#define MMV_KERNELS(NT)                                                                                             \
    extern "C" __global__ void __launch_bounds__(MMV_WARPS * 32)                                                    \
        mmv_f16_t##NT(const __half* w, const __half* x, __half* y, int m, int k, int ldy, int nb) {                 \
        mmv_f16<NT>(w, x, y, m, k, ldy, nb);                                                                        \
    }                                                                                                               \
    extern "C" __global__ void __launch_bounds__(MMV_WARPS * 32)                                                    \
        mmv_f16_t##NT##_f32(const __half* w, const __half* x, float* y, int m, int k, int ldy, int nb) {            \
        mmv_f16<NT>(w, x, y, m, k, ldy, nb);                                                                        \
    }

MMV_KERNELS(1)
MMV_KERNELS(2)
MMV_KERNELS(4)
MMV_KERNELS(8)
