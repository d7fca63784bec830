// Quantized weights against a decode batch on the int8 tensor cores, equal bit for bit to the dp4a
// matvec (quant.cu matvec_<T>_n<NB>) at every batch size:
//   mmq_<T>_t<NT>[_f32](w, xq, y, m, k, ldy, nb)
//     y (nb, m; rows ldy apart) = x (nb, k) @ W (m, k)^T: W in its GGUF blocks (quant_blocks.cuh), x as
//     Q8 units (q8.cuh; row b's units start at xq + b * k / 32). The output comes in tiles of 8 NT rows
//     of x by 16 MMQ_MT weight rows; any grid of blocks (one a multiprocessor: mmq_grid in engine/
//     kernels/matvec_launch.py), MMQ_WARPS * 32 threads, dynamic shared memory mmq_smem_bytes(kind, NT).
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
// dequantize(W) @ quantize_q8(x); the matvec itself (tools/device/mmq_check.py).
//
// The bytes: a slab of a tile's weight rows (each row's 32 units are contiguous: 4 K-quant
// super-blocks, or 32 blocks) and of its x rows (32 Q8 units each) are copied into shared memory by
// cp.async in 16-byte pieces, coalesced, a warp a row (its address worked out once a slab). A block
// stays on its multiprocessor and walks its tiles slab after slab, with up to MMQ_STAGES slabs in
// shared memory (as many as fit: Smem) and the copies running ahead across a tile's end, so a tile's
// sums are stored while the next one's bytes arrive; the first slabs' weights are asked for before
// the kernel waits for the one that writes x (pdl.cuh). A weight row's slab keeps its address modulo
// 16 in shared memory (the aligned 16-byte pieces around it are copied), so the block decoders read
// it as they read global memory. Rows are padded to 16 bytes past a multiple of 128 (x rows to 4 words
// past one), so that the 8 rows of a fragment fall in distinct banks.
//
// Fragments (PTX's m16n8k16 and m16n8k32 integer layouts), lane (g, c) = (lane / 4, lane % 4): A
// holds weight rows g and g + 8, bytes 4c..4c+3 of each half (a Pair's lo for half 0, hi for half 1:
// one k16 mma a half, or both in one k32); B holds x's row g, the same bytes; the output holds rows g
// and g + 8 for x's rows 2c, 2c + 1.
#include "quant_blocks.cuh"
#include "copy.cuh"
#include "matvec.cuh"
#include "parts.cuh"
#include "pdl.cuh"

#ifndef MMQ_WARPS
#define MMQ_WARPS 16  // warps per block, each C = 32 / MMQ_WARPS chains (MMQ_THREADS / 32 in engine/kernels/matvec_launch.py)
#endif
#ifndef MMQ_MT
#define MMQ_MT 2  // 16-row weight tiles a block takes (MMQ_MT in engine/kernels/matvec_launch.py)
#endif
#ifndef MMQ_STAGES
#define MMQ_STAGES 4  // the most slabs in shared memory at once (MMQ_STAGES in engine/kernels/matvec_launch.py)
#endif
constexpr int kSmemBudget = 227 * 1024;  // shared memory a block may take (MMQ_SMEM in engine/kernels/matvec_launch.py)
constexpr int kChains = 32 / MMQ_WARPS;  // chains a warp keeps
constexpr int kSlab = 32;                // units a slab
constexpr int kXStride = kSlab * 48 + 16;  // bytes of an x row's slab in shared memory (sizeof(Q8) = 48)

// Bytes of a weight row's slab, and the room it takes in shared memory (mmq_smem_bytes in matvec_launch.py).
template <class T>
struct Slab {
    static constexpr int BYTES = kSlab * 32 / T::QK * T::BYTES, STRIDE = (BYTES + 32 + 127) / 128 * 128 + 16;
};

__device__ __forceinline__ void mma_s8s8(int* c, unsigned a0, unsigned a1, unsigned b) {
#ifdef __CUDA_ARCH__
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(b));
#else  // the CPU's tests (tests/engine/kernels/cuda_host.h: the warp's fragments gathered)
    const unsigned a[4] = {a0, a1, 0, 0}, bs[2] = {b, 0};
    host_mma_8bit(c, a, bs, 16, true);
#endif
}
// k = 32: A's rows g and g + 8 at bytes 4c.. (a0, a1) and 16 + 4c.. (a2, a3); B's the same bytes.
__device__ __forceinline__ void mma_u8s8_k32(int* c, const Pair& g, const Pair& g8, unsigned b0, unsigned b1) {
#ifdef __CUDA_ARCH__
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(g.lo), "r"(g8.lo), "r"(g.hi), "r"(g8.hi), "r"(b0), "r"(b1));
#else
    const unsigned a[4] = {g.lo, g8.lo, g.hi, g8.hi}, bs[2] = {b0, b1};
    host_mma_8bit(c, a, bs, 32, false);
#endif
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
// aligned 16-byte pieces that hold each row's slab (zeros past the matrix). Warp w copies rows w,
// w + MMQ_WARPS, ..., its lane l pieces l, l + 32, ... of each; offsets in 32 bits (a matrix is
// below 4 GiB), from the 16-byte boundary at or below w.
template <class T>
__device__ __forceinline__ void copy_weights(const u8* __restrict__ w, unsigned rb, int row0, int rows, int m, int t,
                                             u8* dst) {
    constexpr int SB = Slab<T>::BYTES, pieces = (SB + 30) / 16;
    const unsigned skew = reinterpret_cast<size_t>(w) & 15, len = min((unsigned)SB, rb - t * SB) + skew;
    const u8* aligned = w - skew;
    for (int r = threadIdx.x >> 5; r < rows; r += MMQ_WARPS) {
        const unsigned at = (row0 + r) * rb + t * SB, from = (at + skew) & ~15u, end = at + len;
        const unsigned to = smem_addr(dst + r * Slab<T>::STRIDE);
        const bool row_valid = row0 + r < m;
#pragma unroll
        for (int piece = threadIdx.x & 31; piece < pieces; piece += 32) {
            const unsigned src = from + 16 * piece;
            const bool valid = row_valid && src < end;
            cp_async16_to(to + 16 * piece, valid ? (const void*)(aligned + src) : w, valid);
        }
    }
}

// Slab t of x's rows b0 .. b0 + rows - 1 into shared memory at dst (rows kXStride apart; zeros past
// the batch and past the row's units), rows to warps and pieces to lanes the same way.
__device__ __forceinline__ void copy_x(const Q8* __restrict__ xq, int units, int b0, int rows, int nb, int t, u8* dst) {
    constexpr int pieces = kSlab * 3;  // a Q8 unit is three 16-byte pieces
    const int have = 3 * min(kSlab, units - kSlab * t);
    const char* x = reinterpret_cast<const char*>(xq);
    for (int r = threadIdx.x >> 5; r < rows; r += MMQ_WARPS) {
        const unsigned from = ((b0 + r) * units + kSlab * t) * (unsigned)sizeof(Q8);
        const unsigned to = smem_addr(dst + r * kXStride);
        const bool row_valid = b0 + r < nb;
#pragma unroll
        for (int piece = threadIdx.x & 31; piece < pieces; piece += 32) {
            const bool valid = row_valid && piece < have;
            cp_async16_to(to + 16 * piece, valid ? (const void*)(x + from + 16 * piece) : xq, valid);
        }
    }
}

// A block's shared memory (mmq_smem_bytes in matvec_launch.py): STAGES stages of STAGE bytes (a slab of its
// weight rows, then of its x rows), as many as fit (at most MMQ_STAGES), and room for the warps' sums
// of OUTS outputs a lane at a time.
template <class T, int NT>
struct Smem {
    static constexpr int STAGE = 16 * MMQ_MT * Slab<T>::STRIDE + 8 * NT * kXStride;
    static constexpr int OUTS = MMQ_MT * NT * 4 < MMQ_WARPS ? MMQ_MT * NT * 4 : MMQ_WARPS;
    static constexpr int SUMS = MMQ_WARPS * OUTS * 32 * 4;
    static constexpr int FIT = (kSmemBudget - SUMS) / STAGE;
    static constexpr int STAGES = FIT < MMQ_STAGES ? FIT : MMQ_STAGES;
    static_assert(STAGES >= 1, "a stage of this tile does not fit in shared memory");
};

// Where the block is in its walk over the output's tiles: tile (a row-major index over RB weight rows by
// CB rows of x), its first weight row and x row, and the slab t of it.
struct Cursor {
    int tile, row0, b0, t;
    __device__ __forceinline__ void at(int index, int across, int rb, int cb) {
        tile = index, row0 = index / across * rb, b0 = index % across * cb, t = 0;
    }
    __device__ __forceinline__ void advance(int slabs, int across, int rb, int cb) {  // the next slab
        if (++t == slabs) at(tile + gridDim.x, across, rb, cb);
    }
};

// The block's slab t of a tile (shared memory ws: its weight rows, xs: its x rows) added to the warp's
// chains' partials: chain l = bitrev5(warp C + i) takes unit 32 t + l.
template <class T, int NT>
__device__ __forceinline__ void add_slab(float (&acc)[kChains][MMQ_MT][NT][4], const u8* ws, const u8* xs,
                                         const u8* __restrict__ w, size_t rb, int row0, int b0, int t, int units,
                                         int nb) {
    constexpr int MT = MMQ_MT, WS = Slab<T>::STRIDE;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    int mis[MT][2];  // where this lane's rows' slabs start in their first 16-byte piece
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) mis[mt][h] = slab_at<T>(w, rb, row0 + 16 * mt + 8 * h + g, t) & 15;
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
}

// A finished tile's outputs from the warps' chains, OUTS outputs a lane at a time through shared memory
// (sums): each warp adds its chains pairwise (its subtree of the matvec's tree), then warp w adds the
// warps' subtrees of output w of the round pairwise (the tree's top levels) and stores it. Leaves the
// partials zero for the next tile.
template <class T, int NT, typename Out>
__device__ __forceinline__ void store_tile(float (&acc)[kChains][MMQ_MT][NT][4], float* sums, Out* __restrict__ y,
                                           int row0, int b0, int m, int nb, int ldy) {
    constexpr int P = MMQ_MT * NT * 4, OUTS = Smem<T, NT>::OUTS;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
#pragma unroll
    for (int p0 = 0; p0 < P; p0 += OUTS) {
#pragma unroll
        for (int j = 0; j < OUTS; ++j) {
            float v[kChains];
#pragma unroll
            for (int i = 0; i < kChains; ++i) v[i] = (&acc[i][0][0][0])[p0 + j], (&acc[i][0][0][0])[p0 + j] = 0.f;
            sums[(warp * OUTS + j) * 32 + lane] = pairwise_sum(v);
        }
        __syncthreads();
        if (warp < OUTS) {
            float v[MMQ_WARPS];
#pragma unroll
            for (int u = 0; u < MMQ_WARPS; ++u) v[u] = sums[(u * OUTS + warp) * 32 + lane];
            const int p = p0 + warp, mt = p / (4 * NT), nt = p / 4 % NT, o = p % 4;  // p = (mt NT + nt) 4 + o
            const int row = row0 + 16 * mt + g + 8 * (o >> 1), col = b0 + 8 * nt + 2 * c + (o & 1);
            const float sum = pairwise_sum(v);
            if (row < m && col < nb) store(y, (size_t)col * ldy + row, sum);
        }
        __syncthreads();  // the sums are read before the next round writes them
    }
}

// The kernel: a persistent block walks tiles blockIdx.x, blockIdx.x + gridDim.x, ..., one slab after
// another, STAGES - 1 slabs ahead of the one it adds, across tile ends (the next tile's slabs arrive
// while a tile's sums are stored).
template <class T, int NT, typename Out>
__device__ __forceinline__ void mmq(const u8* __restrict__ w, const Q8* __restrict__ xq, Out* __restrict__ y, int m,
                                    int k, int ldy, int nb) {
    constexpr int RB = 16 * MMQ_MT, CB = 8 * NT, S = Smem<T, NT>::STAGES;  // weight rows, x rows of a tile
    constexpr int WS = Slab<T>::STRIDE, STAGE = Smem<T, NT>::STAGE;  // STAGE = RB WS + CB kXStride
    extern __shared__ __align__(128) u8 smem[];  // S stages, then the sums
    float* sums = reinterpret_cast<float*>(smem + S * STAGE);
    const int units = k >> 5, slabs = (units + kSlab - 1) / kSlab, across = (nb + CB - 1) / CB;
    const int tiles = across * ((m + RB - 1) / RB);
    const int total = blockIdx.x < tiles ? ((tiles - 1 - blockIdx.x) / gridDim.x + 1) * slabs : 0;  // its slabs
    const size_t rb = row_bytes<T>(k);
    Cursor fetch, add;  // the next slab to copy, the next to add
    fetch.at(blockIdx.x, across, RB, CB);
    add = fetch;
    {
        Cursor c = fetch;  // weights no kernel writes: before the wait
        for (int q = 0; q < S - 1 && q < total; ++q, c.advance(slabs, across, RB, CB))
            copy_weights<T>(w, rb, c.row0, RB, m, c.t, smem + q * STAGE);
    }
    after_producer();
    for (int q = 0; q < S - 1; ++q) {
        if (q < total) {
            copy_x(xq, units, fetch.b0, CB, nb, fetch.t, smem + q * STAGE + RB * WS);
            fetch.advance(slabs, across, RB, CB);
        }
        cp_async_commit();
    }
    float acc[kChains][MMQ_MT][NT][4];
#pragma unroll
    for (int i = 0; i < kChains; ++i)
#pragma unroll
        for (int p = 0; p < MMQ_MT * NT * 4; ++p) (&acc[i][0][0][0])[p] = 0.f;
#pragma unroll 1
    for (int q = 0; q < total; ++q) {
        const int next = q + S - 1;
        if (next < total) {
            u8* stage = smem + (next % S) * STAGE;
            copy_weights<T>(w, rb, fetch.row0, RB, m, fetch.t, stage);
            copy_x(xq, units, fetch.b0, CB, nb, fetch.t, stage + RB * WS);
            fetch.advance(slabs, across, RB, CB);
        }
        cp_async_commit();
        cp_async_wait<S - 1>();
        __syncthreads();
        const u8* ws = smem + (q % S) * STAGE;
        add_slab<T, NT>(acc, ws, ws + RB * WS, w, rb, add.row0, add.b0, add.t, units, nb);
        __syncthreads();  // the stage is read before a later slab's copies overwrite it
        if (add.t == slabs - 1) store_tile<T, NT>(acc, sums, y, add.row0, add.b0, m, nb, ldy);
        add.advance(slabs, across, RB, CB);
    }
    cp_async_wait<0>();
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

#if IN_PART(0)
MMQ(Q4_0)
#endif
#if IN_PART(1)
MMQ(Q4_1)
#endif
#if IN_PART(2)
MMQ(Q5_0)
#endif
#if IN_PART(3)
MMQ(Q5_1)
#endif
#if IN_PART(4)
MMQ(Q8_0)
#endif
#if IN_PART(5)
MMQ(Q4_K)
#endif
#if IN_PART(6)
MMQ(Q5_K)
#endif
#if IN_PART(7)
MMQ(Q6_K)
#endif
#if IN_PART(8)
MMQ(IQ2_XXS)
#endif
#if IN_PART(9)
MMQ(IQ2_XS)
#endif
#if IN_PART(10)
MMQ(IQ2_S)
#endif
#if IN_PART(11)
MMQ(IQ3_XXS)
#endif
#if IN_PART(12)
MMQ(IQ3_S)
#endif
#if IN_PART(13)
MMQ(IQ4_NL)
#endif
#if IN_PART(14)
MMQ(IQ4_XS)
#endif
