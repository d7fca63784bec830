// Quantized weights against a decode batch on the int8 tensor cores, equal bit for bit to the dp4a
// matvec (quant.cu matvec_<T>_n<NB>) at every batch size:
//   mmq_<T>_t<NT>[_f32](w, xq, y, m, k, ldy, nb)
//     y (nb, m; rows ldy apart) = x (nb, k) @ W (m, k)^T: W in its GGUF blocks (blocks.cuh), x as
//     Q8 units (q8.cuh; row b's units start at xq + b * k / 32). Grid (ceil(nb / 8 NT), ceil(m / 16
//     MMQ_MT)), MMQ_WARPS * 32 threads, dynamic shared memory mmq_smem_bytes(kind, NT) (engine/kernels/
//     __init__.py): a block takes 8 NT rows of x against 16 MMQ_MT weight rows.
//
// The integers: one mma.sync m16n8k32 u8 x s8 -> s32 gives the exact integer dot products of a
// unit of 16 weight rows' unsigned bytes with 8 rows of x's int8 quants: the very integers the
// matvec's dp4a chains make. Q6_K's scales change every 16 values: there, one m16n8k16 s8 x s8 per
// half, of the centered bytes q - 32 (the matvec gets the same integers as its dp4a sums minus 32
// times x's). Each (weight row, x row) pair's integers are added to the chain's partial by the
// matvec's own rounded steps (matvec.cuh unit_add).
//
// The order, the matvec's: there, lane l of a warp adds the values of units l, l + 32, l + 64, ...
// one after another into its partial (a "chain"), and the warp's xor reduction adds the 32 chains
// as a binary tree (chain l first with chain l ^ 16, those sums with the ones 8 apart, ...). Here
// the units come in slabs of 32 (slab t: units 32 t .. 32 t + 31, one of each chain), and warp w of
// a block keeps C = 32 / MMQ_WARPS chains' partials in registers: chains bitrev5(w C + i), i < C, the
// leaves of one subtree of the matvec's tree. Each slab adds one unit to each chain, so every chain
// still adds its units in order. At the end a warp adds its chains pairwise (its subtree), and the
// warps' subtrees are added pairwise through shared memory, the tree's top levels (each warp takes a
// share of the outputs). Every addition is the matvec's addition
// of the same two values (a + b and b + a are the same float), so each output has the matvec's bits;
// nothing depends on nb, NT, MMQ_WARPS, MMQ_MT, MMQ_STAGES or the rows beside it. NumPy reference:
// dequantize(W) @ quantize_q8(x); the matvec itself (tools/mmq_check.py).
//
// The bytes: a slab of the block's weight rows (each row's 32 units are contiguous: 4 K-quant
// super-blocks, or 32 blocks) and of its x rows (32 Q8 units each) are copied into shared memory by
// cp.async in 16-byte pieces, all of the block's threads together, coalesced; MMQ_STAGES slabs are in
// flight, and the first slabs' weights are asked for before the kernel waits for the one that writes
// x (pdl.cuh). A weight row's slab keeps its address modulo 16 in shared memory (the aligned
// 16-byte pieces around it are copied), so the block decoders read it as they read global memory.
// Rows are padded to 16 bytes past a multiple of 128 (x rows to 4 words past one), so that the 8 rows
// of a fragment fall in distinct banks.
//
// Fragments (PTX's m16n8k16 and m16n8k32 integer layouts), lane (g, c) = (lane / 4, lane % 4): A
// holds weight rows g and g + 8, bytes 4c..4c+3 of each half (a Pair's lo for half 0, hi for half 1:
// one k16 mma a half, or both in one k32); B holds x's row g, the same bytes; the output holds rows g
// and g + 8 for x's rows 2c, 2c + 1.
#include "blocks.cuh"
#include "copy.cuh"
#include "matvec.cuh"
#include "pdl.cuh"

#ifndef MMQ_WARPS
#define MMQ_WARPS 16  // warps per block, each C = 32 / MMQ_WARPS chains (MMQ_THREADS / 32 in engine/kernels/__init__.py)
#endif
#ifndef MMQ_MT
#define MMQ_MT 2  // 16-row weight tiles a block takes (MMQ_MT in engine/kernels/__init__.py)
#endif
#ifndef MMQ_STAGES
#define MMQ_STAGES 2  // slabs in shared memory at once (MMQ_STAGES in engine/kernels/__init__.py)
#endif
constexpr int kChains = 32 / MMQ_WARPS;  // chains a warp keeps
constexpr int kSlab = 32;                // units a slab
constexpr int kXStride = kSlab * 48 + 16;  // bytes of an x row's slab in shared memory (sizeof(Q8) = 48)

// Bytes of a weight row's slab, and the room it takes in shared memory (mmq_smem_bytes in __init__.py).
template <class T>
struct Slab {
    static constexpr int BYTES = kSlab * 32 / T::QK * T::BYTES, STRIDE = (BYTES + 32 + 127) / 128 * 128 + 16;
};

__device__ __forceinline__ void mma_s8s8(int* c, unsigned a0, unsigned a1, unsigned b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(b));
}
// k = 32: A's rows g and g + 8 at bytes 4c.. (a0, a1) and 16 + 4c.. (a2, a3); B's the same bytes.
__device__ __forceinline__ void mma_u8s8_k32(int* c, const Pair& g, const Pair& g8, unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(g.lo), "r"(g8.lo), "r"(g.hi), "r"(g8.hi), "r"(b0), "r"(b1));
}

// An integer of magnitude below 2^22 as the exact float, by an integer add and a float subtract
// (both full rate; the conversion instruction is not): 0x4B400000 is 1.5 * 2^23.
__device__ __forceinline__ float exact_float(int s) { return __int_as_float(0x4B400000 + s) - 12582912.f; }

// Where slab t of weight row r starts in global memory (its offset in its first 16-byte piece is
// where it starts in shared memory).
template <class T>
__device__ __forceinline__ size_t slab_at(const u8* w, size_t rb, int r, int t) {
    return reinterpret_cast<size_t>(w + (size_t)r * rb + (size_t)t * Slab<T>::BYTES);
}

// Adds v[0] .. v[N - 1] as a binary tree of adjacent pairs (the matvec's reduction order) -> the sum.
template <int N>
__device__ __forceinline__ float pairwise_sum(float (&v)[N]) {
#pragma unroll
    for (int step = 1; step < N; step *= 2)
#pragma unroll
        for (int u = 0; u < N; u += 2 * step) v[u] = __fadd_rn(v[u], v[u + step]);
    return v[0];
}

// Slab t of rows row0 .. row0 + rows - 1 into shared memory at dst (rows Slab<T>::STRIDE apart): the
// aligned 16-byte pieces that hold each row's slab (zeros past the matrix).
template <class T>
__device__ __forceinline__ void copy_weights(const u8* __restrict__ w, size_t rb, int row0, int rows, int m, int t,
                                             u8* dst) {
    constexpr int SB = Slab<T>::BYTES, pieces = (SB + 30) / 16;
    const size_t start = (size_t)t * SB, len = min((size_t)SB, rb - start);
    for (int i = threadIdx.x; i < rows * pieces; i += blockDim.x) {
        const int r = i / pieces, piece = i % pieces;
        const size_t at = slab_at<T>(w, rb, row0 + r, t);
        const size_t src = (at & ~(size_t)15) + 16 * piece;
        const bool valid = row0 + r < m && src < at + len;
        cp_async16_to(smem_addr(dst + r * Slab<T>::STRIDE + 16 * piece), valid ? (const void*)src : w, valid);
    }
}

// Slab t of x's rows b0 .. b0 + rows - 1 into shared memory at dst (rows kXStride apart; zeros past
// the batch and past the row's units).
__device__ __forceinline__ void copy_x(const Q8* __restrict__ xq, int units, int b0, int rows, int nb, int t, u8* dst) {
    constexpr int pieces = kSlab * 3;  // a Q8 unit is three 16-byte pieces
    for (int i = threadIdx.x; i < rows * pieces; i += blockDim.x) {
        const int r = i / pieces, piece = i % pieces, unit = kSlab * t + piece / 3;
        const bool valid = b0 + r < nb && unit < units;
        const char* src = reinterpret_cast<const char*>(xq + (size_t)(b0 + r) * units + kSlab * t) + 16 * piece;
        cp_async16_to(smem_addr(dst + r * kXStride + 16 * piece), valid ? (const void*)src : xq, valid);
    }
}

template <class T, int NT, typename Out>
__device__ __forceinline__ void mmq(const u8* __restrict__ w, const Q8* __restrict__ xq, Out* __restrict__ y, int m,
                                    int k, int ldy, int nb) {
    constexpr int MT = MMQ_MT, RB = 16 * MT, CB = 8 * NT, P = MT * NT * 4;  // block's weight rows, x rows; outputs a lane
    constexpr int WS = Slab<T>::STRIDE, STAGE = RB * WS + CB * kXStride;
    extern __shared__ __align__(128) u8 smem[];  // MMQ_STAGES x {RB weight rows, CB x rows}; then the warps' sums
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int row0 = blockIdx.y * RB, b0 = blockIdx.x * CB, units = k >> 5, slabs = (units + kSlab - 1) / kSlab;
    const size_t rb = row_bytes<T>(k);
    if (row0 >= m) {  // the whole block (a block's rows are its grid row's)
        after_producer();
        return;
    }
    for (int t = 0; t < MMQ_STAGES - 1 && t < slabs; ++t)  // weights no kernel writes: before the wait
        copy_weights<T>(w, rb, row0, RB, m, t, smem + t * STAGE);
    after_producer();
    for (int t = 0; t < MMQ_STAGES - 1; ++t) {
        if (t < slabs) copy_x(xq, units, b0, CB, nb, t, smem + t * STAGE + RB * WS);
        cp_async_commit();
    }
    float acc[kChains][MT][NT][4];
#pragma unroll
    for (int i = 0; i < kChains; ++i)
#pragma unroll
        for (int p = 0; p < P; ++p) (&acc[i][0][0][0])[p] = 0.f;
#pragma unroll 1
    for (int t = 0; t < slabs; ++t) {
        const int next = t + MMQ_STAGES - 1;
        if (next < slabs) {
            u8* stage = smem + (next % MMQ_STAGES) * STAGE;
            copy_weights<T>(w, rb, row0, RB, m, next, stage);
            copy_x(xq, units, b0, CB, nb, next, stage + RB * WS);
        }
        cp_async_commit();
        cp_async_wait<MMQ_STAGES - 1>();
        __syncthreads();
        const u8* ws = smem + (t % MMQ_STAGES) * STAGE;
        const u8* xs = ws + RB * WS;
        int mis[MT][2];  // where this lane's rows' slabs start in their first 16-byte piece
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h)
                mis[mt][h] = slab_at<T>(w, rb, row0 + 16 * mt + 8 * h + g, t) & 15;
#pragma unroll
        for (int i = 0; i < kChains; ++i) {
            const int l = __brev(warp * kChains + i) >> 27;  // chain l: unit kSlab t + l of this slab
            if (kSlab * t + l >= units) continue;  // the row's last slab is short (uniform across the warp)
            Pair a[MT][2];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    T::pair(ws + (16 * mt + 8 * h + g) * WS + mis[mt][h], l, c, a[mt][h]);
                    if constexpr (T::TWO_SCALES) a[mt][h].lo = T::centered(a[mt][h].lo), a[mt][h].hi = T::centered(a[mt][h].hi);
                }
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                if (b0 + 8 * nt >= nb) break;  // the tile is past the batch (uniform across the warp)
                const u8* xr = xs + 8 * nt * kXStride + l * 48;
                const int* q = reinterpret_cast<const int*>(xr + g * kXStride);
                const unsigned blo = q[c], bhi = q[4 + c];
                const float4 x0 = *reinterpret_cast<const float4*>(xr + 2 * c * kXStride + 32);
                const float4 x1 = *reinterpret_cast<const float4*>(xr + (2 * c + 1) * kXStride + 32);
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {  // x's fragment serves every weight tile of the block
                    int s0[4] = {0, 0, 0, 0}, s1[4] = {0, 0, 0, 0};
                    if constexpr (T::TWO_SCALES) {
                        mma_s8s8(s0, a[mt][0].lo, a[mt][1].lo, blo);
                        mma_s8s8(s1, a[mt][0].hi, a[mt][1].hi, bhi);
                    } else {
                        mma_u8s8_k32(s0, a[mt][0], a[mt][1], blo, bhi);
                    }
#pragma unroll
                    for (int o = 0; o < 4; ++o) {  // (row g, x rows 2c, 2c + 1), (row g + 8, the same)
                        float& sum = acc[i][mt][nt][o];
                        const Pair& wu = a[mt][o >> 1];
                        const float4& xu = o & 1 ? x1 : x0;
                        if constexpr (T::TWO_SCALES)
                            sum = unit_add(sum, wu, xu, exact_float(s0[o]), exact_float(s1[o]));
                        else
                            sum = unit_add(sum, wu, xu, exact_float(s0[o]));
                    }
                }
            }
        }
        __syncthreads();  // the stage is read before a later slab's copies overwrite it
    }
    cp_async_wait<0>();
    // the warp's chains, adjacent leaves of the matvec's tree, added pairwise: the warp's subtree
    float* sums = reinterpret_cast<float*>(smem);  // [warp][output][lane] (the stages are done with)
#pragma unroll
    for (int p = 0; p < P; ++p) {
        float v[kChains];
#pragma unroll
        for (int i = 0; i < kChains; ++i) v[i] = (&acc[i][0][0][0])[p];
        sums[(warp * P + p) * 32 + lane] = pairwise_sum(v);
    }
    __syncthreads();
    // the warps' subtrees, added pairwise (the tree's top levels); warp w takes outputs w, w + MMQ_WARPS, ...
#pragma unroll 1
    for (int p = warp; p < P; p += MMQ_WARPS) {
        float v[MMQ_WARPS];
#pragma unroll
        for (int u = 0; u < MMQ_WARPS; ++u) v[u] = sums[(u * P + p) * 32 + lane];
        const int mt = p / (4 * NT), nt = p / 4 % NT, o = p % 4;  // p = (mt NT + nt) 4 + o
        const int row = row0 + 16 * mt + g + 8 * (o >> 1), col = b0 + 8 * nt + 2 * c + (o & 1);
        const float sum = pairwise_sum(v);
        if (row < m && col < nb) store(y, (size_t)col * ldy + row, sum);
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
