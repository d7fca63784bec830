// Quantized weights against a decode batch on the int8 tensor cores, equal bit for bit to the dp4a
// matvec (quant.cu matvec_<T>_n<NB>) at every batch size:
//   mmq_<T>_t<NT>[_f32](w, xq, y, m, k, ldy, nb)
//     y (nb, m; rows ldy apart) = x (nb, k) @ W (m, k)^T: W in its GGUF blocks (blocks.cuh), x as
//     Q8 units (q8.cuh; row b's units start at xq + b * k / 32). Grid (ceil(nb / 8 NT), ceil(m / 16
//     MMQ_MT)), MMQ_WARPS * 32 threads, the warps' stacks in dynamic shared memory (a float per
//     output, lane and level: mmq_smem_bytes in engine/kernels/__init__.py): a block takes 8 NT rows
//     of x against 16 MMQ_MT weight rows.
//
// The integers: each unit of 32 values splits into its two halves of 16 (Q6_K's scales change
// every 16 values); per half, one mma.sync m16n8k16 u8 x s8 -> s32 gives the exact integer dot
// products of 16 weight rows' unsigned bytes with 8 rows of x's int8 quants: the very integers the
// matvec's dp4a chains make. Each (weight row, x row) pair's two integers become the unit's value in
// floats by the matvec's own rounded steps (matvec.cuh unit_value):
//   dx * (d0 s0 + d1 s1) + (m0 sx0 + m1 sx1)
//
// The order, the matvec's: there, lane l of a warp adds the values of units l, l + 32, l + 64, ...
// one after another into its partial (a "chain"), and the warp's xor reduction adds the 32 chains
// as a binary tree (chain l first with chain l ^ 16, those sums with the ones 8 apart, ...). Here a
// block holds a tile of outputs (16 MMQ_MT weight rows x 8 NT rows of x) and its MMQ_WARPS warps walk the
// chains, each chain's units in order, taken in the order that makes the tree's leaves adjacent:
// chain bitrev5(i) for i = 0..31 (0, 16, 8, 24, ...). Warp w takes chains i = w C .. w C + C - 1
// (C = 32 / MMQ_WARPS: a whole subtree), merging them as a binary counter carries (a subtree of
// 2^j chains waits in shared memory, level j of the warp's stack, until its sibling arrives); then
// warp 0 adds the warps' subtrees pairwise, the tree's top levels. Every addition is the matvec's
// addition of the same two values (a + b and b + a are the same float), so each output has the
// matvec's bits; nothing depends on nb, NT, MMQ_WARPS, MMQ_MT or the rows beside it. The warps of a block
// share the weight rows (L1) and split the row's units among them, so a block has as many units in
// flight as the matvec's lanes. NumPy reference: dequantize(W) @ quantize_q8(x); the matvec itself
// (tools/mmq_check.py).
//
// Fragments (PTX's m16n8k16 integer layout), lane (g, c) = (lane / 4, lane % 4): A holds weight
// rows g and g + 8, bytes 4c..4c+3 of the half (a Pair's lo for half 0, hi for half 1); B holds x's
// row g, the same bytes; the output holds rows g and g + 8 for x's rows 2c, 2c + 1.
#include "blocks.cuh"
#include "matvec.cuh"
#include "pdl.cuh"

#ifndef MMQ_WARPS
#define MMQ_WARPS 8  // warps per block, each a subtree of 32 / MMQ_WARPS chains (MMQ_THREADS / 32 in engine/kernels/__init__.py)
#endif
constexpr int kChains = 32 / MMQ_WARPS;   // chains a warp walks
constexpr int log2_of(int n) { return n > 1 ? 1 + log2_of(n / 2) : 0; }
constexpr int kLevels = log2_of(kChains);  // levels of a warp's stack of unfinished subtrees
constexpr int kSlots = kLevels > 0 ? kLevels : 1;  // levels it has room for (level 0 also takes its whole subtree)
#ifndef MMQ_MT
#define MMQ_MT 2  // 16-row weight tiles a warp takes: each x fragment it loads serves them all (MMQ_MT in engine/kernels/__init__.py)
#endif
#ifndef MMQ_UNROLL
#define MMQ_UNROLL 2  // units of a chain a warp has in flight
#endif
constexpr int kMmqUnroll = MMQ_UNROLL;
#ifndef MMQ_PREFETCH
#define MMQ_PREFETCH 512  // bytes of each weight row a block asks L2 for before it waits for x (pdl.cuh)
#endif

__device__ __forceinline__ void mma_u8s8(int* c, unsigned a0, unsigned a1, unsigned b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(b));
}

// An integer of magnitude below 2^22 as the exact float, by an integer add and a float subtract
// (both full rate; the conversion instruction is not): 0x4B400000 is 1.5 * 2^23.
__device__ __forceinline__ float exact_float(int s) { return __int_as_float(0x4B400000 + s) - 12582912.f; }

template <class T, int NT, typename Out>
__device__ __forceinline__ void mmq(const u8* __restrict__ w, const Q8* __restrict__ xq, Out* __restrict__ y, int m,
                                    int k, int ldy, int nb) {
    constexpr int MT = MMQ_MT, P = MT * NT * 4;  // weight tiles a warp; outputs a lane
    // [warp][level][output][lane]: each warp's unfinished subtrees, then (level 0) its whole subtree
    extern __shared__ float stack_mem[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int per_warp = kSlots * P * 32;
    float* stack = stack_mem + (size_t)warp * per_warp + lane;  // [level][output] * 32
    const int row0 = blockIdx.y * 16 * MT, b0 = blockIdx.x * 8 * NT, units = k >> 5;
    const size_t rb = row_bytes<T>(k);
    if (threadIdx.x < 32 && row0 < m)  // the block's rows on their way while the kernel before this one finishes
        prefetch_rows_l2(w + row0 * rb, rb, min(16 * MT, m - row0), min(rb, (size_t)MMQ_PREFETCH), lane, 32);
    after_producer();
    if (row0 >= m) return;  // the whole block (a block's rows are its grid row's)
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
    const Q8* xb = xq + (size_t)(b0 + g) * units;
    const Q8* xs = xq + (size_t)(b0 + 2 * c) * units;
    const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
    float acc[MT][NT][4];
#pragma unroll 1
    for (int i = 0; i < kChains; ++i) {
        const int l = __brev(warp * kChains + i) >> 27;  // chain l: units l, l + 32, ...
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.f;
#pragma unroll kMmqUnroll
        for (int s = l; s < units; s += 32) {
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
                const int b = b0 + 8 * nt;
                if (b >= nb) break;  // the tile is past the batch (uniform across the warp)
                const bool b_in = b + g < nb, x0_in = b + 2 * c < nb, x1_in = b + 2 * c + 1 < nb;
                const int* q = reinterpret_cast<const int*>(xb + (size_t)8 * nt * units + s);
                const unsigned blo = b_in ? q[c] : 0u, bhi = b_in ? q[4 + c] : 0u;
                const Q8* xr = xs + (size_t)8 * nt * units + s;
                const float4 x0 = x0_in ? *reinterpret_cast<const float4*>(&xr->d) : zero;
                const float4 x1 = x1_in ? *reinterpret_cast<const float4*>(&xr[units].d) : zero;
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {  // x's fragment serves every weight tile of the warp
                    int s0[4] = {0, 0, 0, 0}, s1[4] = {0, 0, 0, 0};
                    mma_u8s8(s0, a[mt][0].lo, a[mt][1].lo, blo);
                    mma_u8s8(s1, a[mt][0].hi, a[mt][1].hi, bhi);
#pragma unroll
                    for (int o = 0; o < 4; ++o)  // (row g, x rows 2c, 2c + 1), (row g + 8, the same)
                        acc[mt][nt][o] = __fadd_rn(acc[mt][nt][o],
                                                   unit_value(a[mt][o >> 1], o & 1 ? x1 : x0,
                                                              exact_float(s0[o]), exact_float(s1[o])));
                }
            }
        }
        // carry: chain i closes the subtrees of 2, 4, ... chains its trailing one bits name
        int j = 0;
        for (; (i >> j) & 1; ++j)
#pragma unroll
            for (int p = 0; p < P; ++p)
                (&acc[0][0][0])[p] = __fadd_rn(stack[(j * P + p) * 32], (&acc[0][0][0])[p]);
        if (i + 1 < kChains) {
#pragma unroll
            for (int p = 0; p < P; ++p) stack[(j * P + p) * 32] = (&acc[0][0][0])[p];
        }
    }
    // acc: the warp's subtree. Warp 0 adds the warps' subtrees pairwise, level by level.
    if (MMQ_WARPS > 1) {
        __syncthreads();  // every warp's stack reads are done before level 0 is overwritten
#pragma unroll
        for (int p = 0; p < P; ++p) stack[p * 32] = (&acc[0][0][0])[p];
        __syncthreads();
        if (warp != 0) return;
#pragma unroll
        for (int p = 0; p < P; ++p) {
            float v[MMQ_WARPS];
#pragma unroll
            for (int u = 0; u < MMQ_WARPS; ++u) v[u] = stack[u * per_warp + p * 32];
#pragma unroll
            for (int len = MMQ_WARPS; len > 1; len >>= 1)
#pragma unroll
                for (int u = 0; u < len / 2; ++u) v[u] = __fadd_rn(v[2 * u], v[2 * u + 1]);
            (&acc[0][0][0])[p] = v[0];
        }
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int o = 0; o < 4; ++o) {
                const int row = row0 + 16 * mt + g + 8 * (o >> 1), col = b0 + 8 * nt + 2 * c + (o & 1);
                if (row < m && col < nb) store(y, (size_t)col * ldy + row, acc[mt][nt][o]);
            }
}

#define MMQ_NT(T, NT)                                                                                               \
    extern "C" __global__ void __launch_bounds__(MMQ_WARPS * 32)                                                    \
        mmq_##T##_t##NT(const u8* w, const Q8* xq, __half* y, int m, int k, int ldy, int nb) {                      \
        mmq<T, NT>(w, xq, y, m, k, ldy, nb);                                                                        \
    }                                                                                                               \
    extern "C" __global__ void __launch_bounds__(MMQ_WARPS * 32)                                                    \
        mmq_##T##_t##NT##_f32(const u8* w, const Q8* xq, float* y, int m, int k, int ldy, int nb) {                 \
        mmq<T, NT>(w, xq, y, m, k, ldy, nb);                                                                        \
    }
#define MMQ(T) MMQ_NT(T, 1) MMQ_NT(T, 2) MMQ_NT(T, 4)

MMQ(Q4_0)
MMQ(Q4_1)
MMQ(Q5_0)
MMQ(Q5_1)
MMQ(Q8_0)
MMQ(Q4_K)
MMQ(Q5_K)
MMQ(Q6_K)
