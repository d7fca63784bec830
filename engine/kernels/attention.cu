// Flash attention for prompt chunks (and single tokens), FlashAttention-2 style, on tensor cores
// through mma.sync m16n8k16 (fp16 in, fp32 accumulate). NumPy reference: ArrayOps.attention.
//
// A batch of sequences, each with its own length: sequence s has n_s = q_start[s+1] - q_start[s]
// query tokens at absolute positions pos0[s] .. pos0[s] + n_s - 1, and its keys/values are the
// cache rows 0 .. pos0[s] + n_s - 1 (the prefix read before, then the chunk itself). Causal within
// the chunk, full over the prefix, grouped-query heads: the `group` query heads that share one
// K/V head are packed into the rows of one tile (row r = token r / group, head r % group), so a
// K/V tile is loaded once for all of them. Scores live in registers only; one pass over K/V.
//
// Measured on an H200 (tools/device/gpu_kernels_check.py): 145-153 TFLOP/s on a 2048-token chunk with no
// prefix, 215-227 at depths of 14K-63K: about 30% of the 720-758 cuBLAS reaches on the same card
// (mma.sync; a wgmma/TMA kernel is what would close the gap).
//
// Grid: (row tiles, kv_heads, sequences); a block of 4 warps owns 64 rows, each warp 16. K/V tiles
// of 64 keys stream through two shared-memory stages (cp.async), fragments come by ldmatrix.
#include <cuda_fp16.h>

#include "mma.cuh"
#include "chunk_rows.cuh"
#include "paged.cuh"
#include "parts.cuh"
#include "pdl.cuh"
#include "q8.cuh"
#include "q8k.cuh"

constexpr int WARPS = 4;
constexpr int BR = 16 * WARPS;  // query rows per block (16 per warp: the mma's M)
constexpr int BC = 64;          // keys per tile: S is 16 x 64 per warp = 32 fp32 registers a thread
constexpr int BC_LOG2 = 6;
static_assert(BC == 1 << BC_LOG2, "BC_LOG2");
constexpr int PAD = 8;          // fp16 padding per shared row: rows land on distinct banks
static_assert(BR == BC, "stage 1's K tile also stages the Q rows");

template <int D>
struct Tiles {  // dynamic shared memory: two stages of (K tile, V tile), each BC x ROW fp16
    static constexpr int ROW = D + PAD;
    static constexpr int TILE = BC * ROW;
    static constexpr int BYTES = 2 * 2 * TILE * 2;
};

// Keys/values k0..k0+BC-1 of the block's K/V head into a stage, asynchronously, each row through the
// sequence's block table (kv_row.cuh); rows past the block's key_end are zeros.
template <int D>
__device__ __forceinline__ void load_kv_tile(__half* ks, __half* vs, const __half* k, const __half* v,
                                             const ChunkRows& blk, int kv_heads, int block_log2, int k0) {
    // k0 is a multiple of BC: with blocks of BC keys or more the tile lies in one block, found once
    const bool one_block = block_log2 >= BC_LOG2;
    const size_t tile_row = one_block ? kv_row(blk.tbl, k0, blk.kvh, kv_heads, block_log2, D) : 0;
    for (int c = threadIdx.x; c < BC * D / 8; c += WARPS * 32) {
        const int r = c / (D / 8), col = (c % (D / 8)) * 8;
        const bool ok = k0 + r < blk.key_end;
        const size_t row = one_block ? tile_row + (size_t)r * D
                                     : kv_row(blk.tbl, k0 + r, blk.kvh, kv_heads, block_log2, D);
        const size_t off = ok ? row + col : 0;
        cp_async16(ks + r * Tiles<D>::ROW + col, k + off, ok);
        cp_async16(vs + r * Tiles<D>::ROW + col, v + off, ok);
    }
}

// q, out: (tokens, heads, D) fp16; k, v: this layer's pool of KV blocks (paged.cuh), sequence s's
// block table at table + table_off[s]. scale_log2 = log2(e) / sqrt(D). Dynamic shared memory: Tiles<D>::BYTES.
template <int D>
__device__ __forceinline__ void flash_attention(const __half* __restrict__ q, const __half* __restrict__ k,
                                                const __half* __restrict__ v, __half* __restrict__ out,
                                                const int* __restrict__ q_start, const int* __restrict__ pos0,
                                                const int* __restrict__ table, const int* __restrict__ table_off,
                                                int heads, int kv_heads, int block_log2, float scale_log2) {
    extern __shared__ __align__(16) __half smem[];
    constexpr int ROW = Tiles<D>::ROW, TILE = Tiles<D>::TILE;

    ChunkRows blk;
    if (!chunk_rows<BR, BC>(blk, q_start, pos0, table, table_off, heads, kv_heads)) return;

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;

    // ---- tile 0 starts loading into stage 0 while the query rows are staged in stage 1
    load_kv_tile<D>(smem, smem + TILE, k, v, blk, kv_heads, block_log2, 0);
    cp_async_commit();
    __half* qs = smem + 2 * TILE;
    for (int c = threadIdx.x; c < BR * D / 8; c += WARPS * 32) {
        const int r = c / (D / 8), col = (c % (D / 8)) * 8, row = blk.row0 + r;
        uint4 val = make_uint4(0, 0, 0, 0);
        if (row < blk.rows) {
            const int tok = row / blk.group, head = blk.kvh * blk.group + row % blk.group;
            val = *reinterpret_cast<const uint4*>(q + ((size_t)(q_start[blk.s] + tok) * heads + head) * D + col);
        }
        *reinterpret_cast<uint4*>(qs + r * ROW + col) = val;
    }
    __syncthreads();
    uint32_t qa[D / 16][4];  // this warp's 16 query rows as mma A fragments, for the whole pass
    const int wr = warp * 16;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        qa[kk][0] = ld32(qs + (wr + g) * ROW + kk * 16 + 2 * t);
        qa[kk][1] = ld32(qs + (wr + g + 8) * ROW + kk * 16 + 2 * t);
        qa[kk][2] = ld32(qs + (wr + g) * ROW + kk * 16 + 8 + 2 * t);
        qa[kk][3] = ld32(qs + (wr + g + 8) * ROW + kk * 16 + 8 + 2 * t);
    }
    __syncthreads();

    // the two rows this thread holds (fragment rows g and g + 8): their absolute positions
    const int pos_a = blk.position(wr + g), pos_b = blk.position(wr + g + 8);
    float o[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    RowState ra, rb;

    for (int j = 0; j < blk.tiles; ++j) {
        const int k0 = j * BC;
        if (j + 1 < blk.tiles) {  // the next tile loads while this one is computed
            const int next = ((j + 1) & 1) * 2 * TILE;
            load_kv_tile<D>(smem + next, smem + next + TILE, k, v, blk, kv_heads, block_log2, k0 + BC);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const __half* ks = smem + (j & 1) * 2 * TILE;
        const __half* vs = ks + TILE;

        // ---- S = Q K^T (16 x BC per warp); K fragments by ldmatrix, two k-steps per load
        float sc[BC / 8][4];
#pragma unroll
        for (int nt = 0; nt < BC / 8; ++nt) {
            sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.f;
#pragma unroll
            for (int kk = 0; kk < D / 16; kk += 2) {
                uint32_t b[4];
                ldmatrix_x4(b, ks + (nt * 8 + (lane & 7)) * ROW + kk * 16 + (lane >> 3) * 8);
                mma_16x8x16(sc[nt], qa[kk], b[0], b[1]);
                mma_16x8x16(sc[nt], qa[kk + 1], b[2], b[3]);
            }
        }
        // ---- the running softmax (online_softmax.cuh), then O += P V with P straight from registers (the
        // C layout is the A layout) and V fragments by transposing ldmatrix, two dim tiles per load
        float corr_a, corr_b;
        online_softmax<BC>(&sc[0][0], ra, rb, k0, blk.masked(k0, BC), pos_a, pos_b, blk.key_end, scale_log2, corr_a,
                           corr_b);
        rescale<D / 2>(&o[0][0], corr_a, corr_b);
#pragma unroll
        for (int kk = 0; kk < BC / 16; ++kk) {
            uint32_t pa[4];
            p_fragment(&sc[0][0], kk, pa);
#pragma unroll
            for (int dn = 0; dn < D / 8; dn += 2) {
                uint32_t b[4];
                ldmatrix_x4_trans(b, vs + (kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * ROW + dn * 8 +
                                         (lane >> 4) * 8);
                mma_16x8x16(o[dn], pa, b[0], b[1]);
                mma_16x8x16(o[dn + 1], pa, b[2], b[3]);
            }
        }
        __syncthreads();  // this stage is loaded again two tiles on
    }

    write_rows<D>(out, &o[0][0], blk, q_start, heads, wr + g, ra, rb);
}

#define FLASH_ATTENTION(D)                                                                                     \
    extern "C" __global__ void __launch_bounds__(WARPS * 32)                                                   \
        flash_attention_d##D(const __half* q, const __half* k, const __half* v, __half* out, const int* q_start, \
                             const int* pos0, const int* table, const int* table_off, int heads, int kv_heads, \
                             int block_log2, float scale_log2) {                                               \
        flash_attention<D>(q, k, v, out, q_start, pos0, table, table_off, heads, kv_heads, block_log2, scale_log2); \
    }
// Parts (parts.cuh): 9 per head size, in HEAD_DIMS' order: its prompt kernel first, then its decoding kernels of
// 1..8 query heads per K/V head one group a part (a model launches one group's: engine/kernels/model_parts.py);
// a 256-wide head's decoding kernels take at most 2 heads (decode_kernel_groups): its parts are 18..20.
#if IN_PART(0)
FLASH_ATTENTION(64)
#endif
#if IN_PART(9)
FLASH_ATTENTION(128)
#endif
#if IN_PART(18)
FLASH_ATTENTION(256)
#endif

// ---------------------------------------------------------------- flash-decoding: one query token
// A decode step has one query token per sequence: too little work for the prompt kernel's 64-row
// tiles. Here the key range is split: split j of a (kv head, sequence) reads keys [j * per_block,
// +per_block) once for the G query heads that share them (each warp a quarter, 16 keys a round,
// keeping its own softmax state) and writes one partial; block (x, kv head, sequence) takes splits x,
// x + gridDim.x, ... of the `splits` one after another (one each for a few sequences; several for a
// large batch, whose blocks would otherwise be too short to amortize their start and end), and the
// last block of a (sequence, kv head) to finish (an atomic counter, reset by it) merges the partials
// in split order: the same numbers whatever the grid. The grid may cover more keys than present (a
// captured graph serves a range of lengths): blocks past the end only count themselves. Scores: 8 lanes a key (a 16-byte slice each), four
// keys per load; P V: the warp's lanes cover the head dims, keys one by one. K and V of a round are
// loaded before any is used, so one memory round trip serves 16 keys.
constexpr int DEC_WARPS = 4;
constexpr int DEC_ROUND = 16;  // keys a warp takes per round: 4 quads of 4 keys
constexpr int DEC_ROUND_LOG2 = 4;
static_assert(DEC_ROUND == 1 << DEC_ROUND_LOG2, "DEC_ROUND_LOG2");
#ifndef DEC_MIN_BLOCKS  // flash-decoding blocks of up to 4 query heads a multiprocessor holds at once: their
#define DEC_MIN_BLOCKS 3  // registers at most 65536 / (128 x 3) = 168 (d128_g4 takes 240 left to itself,
#endif                    // two blocks an SM; 168 spill nothing); 0 leaves it to ptxas, as for 5-8 heads
constexpr int DEC_SPLITS = 48;  // a long sequence's splits: 48 x 8 K/V heads are one wave of 3 blocks an SM
constexpr int DEC_MAX_SPLITS = (DEC_SPLITS + 31) / 32 * 32;  // the merge's capacity: a lane per split, whole warps
#ifndef DEC_PREFETCH  // 1: a warp's next round of keys finds its block while this round computes (below)
#define DEC_PREFETCH 0  // 1 passes every check on the H200 but is not yet timed (it takes 228 registers, not 168)
#endif

template <int BYTES> struct Bits;
template <> struct Bits<2> { using T = unsigned short; };
template <> struct Bits<4> { using T = unsigned; };
template <> struct Bits<8> { using T = uint2; };
template <> struct Bits<16> { using T = uint4; };
struct __align__(16) Bytes32 { uint4 lo, hi; };  // a q8_0 slice of a 256-wide head's row: 32 values
template <> struct Bits<32> { using T = Bytes32; };

template <int N>
__device__ __forceinline__ void halves_to_float(const void* p, float* f) {
    const __half2* h = reinterpret_cast<const __half2*>(p);
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
        const float2 v = __half22float2(h[i]);
        f[2 * i] = v.x, f[2 * i + 1] = v.y;
    }
}

// N consecutive values of a cached row as one lane loads them (paged.cuh): fp16 (2N bytes, in loads
// of up to 16 bytes), or q8_0 (N int8 and the scale of their group; N divides 32). load() issues the
// loads; widen() turns what came into floats and scale() is what they are to be multiplied by (1 for
// fp16; a q8_0 slice's scale, which the kernel applies once per key and lane rather than per value),
// so a round's loads are all in flight before any is used.
template <int N, bool Q8_0> struct KVSlice;
template <int N> struct KVSlice<N, false> {
    using T = typename Bits<(2 * N >= 16 ? 16 : 2 * N)>::T;
    static constexpr int W = 2 * N / sizeof(T);
    T w[W];
    __device__ __forceinline__ void load(const void* pool, const __half*, size_t at) {
        const T* src = reinterpret_cast<const T*>(static_cast<const __half*>(pool) + at);
#pragma unroll
        for (int c = 0; c < W; ++c) w[c] = src[c];
    }
    __device__ __forceinline__ void clear() {
#pragma unroll
        for (int c = 0; c < W; ++c) w[c] = T{};
    }
    __device__ __forceinline__ void widen(float* f) const { halves_to_float<N>(w, f); }
    __device__ __forceinline__ float scale() const { return 1.f; }
};
template <int N> struct KVSlice<N, true> {
    using T = typename Bits<N>::T;
    T w;
    __half s;
    __device__ __forceinline__ void load(const void* pool, const __half* scales, size_t at) {
        w = *reinterpret_cast<const T*>(static_cast<const signed char*>(pool) + at);
        s = scales[at / 32];
    }
    __device__ __forceinline__ void clear() { w = T{}, s = __float2half(0.f); }
    // The int8 values as floats, exactly and without I2F (a quarter-rate instruction): each byte,
    // offset by 128, becomes the low mantissa byte of 2^23 (one byte permute), less 2^23 + 128.
    __device__ __forceinline__ void widen(float* f) const {
        unsigned words[(N + 3) / 4];
        if constexpr (N >= 4) {
#pragma unroll
            for (int i = 0; i < N / 4; ++i) words[i] = reinterpret_cast<const unsigned*>(&w)[i];
        } else {
            words[0] = w;
        }
#pragma unroll
        for (int i = 0; i < N; ++i)
            f[i] = __int_as_float(__byte_perm(words[i / 4] ^ 0x80808080u, 0x4B000000u, 0x7650 | (i % 4))) - 8388736.f;
    }
    __device__ __forceinline__ float scale() const { return __half2float(s); }
};

// q: (sequences, heads, D) fp16, one token each at position pos0[s]: keys 0..pos0[s] are visible.
// part_o: (sequences, heads, splits, D) fp32 unnormalized; part_ml: (sequences, heads, splits, 2)
// the max (log2 domain) and sum; k, v: the layer's pool, fp16 or its q8_0 values and
// k_scales/v_scales (paged.cuh) with Q8_0; out: (sequences, heads, D) fp16 and, unless null, its Q8 units
// q8 (sequences, heads * D / 32) and its Q8K super-blocks q8k (sequences, heads * D / 256; a block's G * D outputs
// whole super-blocks: G * D a multiple of 256, else q8k is not written); counters: (sequences, kv_heads)
// int, zero between launches. heads = kv_heads * G. The grid's kv heads may be a K/V head's query
// heads in kv_div groups of G (kv_heads of the grid = the model's x kv_div): group kvh reads K/V head
// kvh / kv_div. Eight query heads a block spill registers; two blocks of four do not, and double
// the blocks of a short context (the K/V rows are read twice, the second time mostly from L2).
template <int D, int G, bool Q8_0>
__device__ __forceinline__ void flash_decode(const __half* __restrict__ q, const void* __restrict__ k,
                                             const void* __restrict__ v, const __half* __restrict__ k_scales,
                                             const __half* __restrict__ v_scales, float* __restrict__ part_o,
                                             float* __restrict__ part_ml, __half* __restrict__ out,
                                             Q8* __restrict__ q8, Q8K* __restrict__ q8k, int* __restrict__ counters,
                                             const int* __restrict__ pos0,
                                             const int* __restrict__ table, const int* __restrict__ table_off,
                                             int kv_heads, int kv_div, int block_log2, float scale_log2, int splits) {
    constexpr int DQ = D / 8;   // dims per lane while scoring (8 lanes a key)
    constexpr int DV = D / 32;  // dims per lane in P V
    constexpr int QS = DQ + 4;  // a lane's q slice in shared memory, padded: 8 slices on distinct banks
    __shared__ __align__(16) float qs[G][8][QS];
    __shared__ float wm[DEC_WARPS][G], wl[DEC_WARPS][G];
    __shared__ float wo[DEC_WARPS][G][D];
    __shared__ float weight[G][DEC_MAX_SPLITS], inv_den[G];
    __shared__ bool last;
    const int s = blockIdx.z, kvh = blockIdx.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, sub = lane >> 3, chunk = lane & 7;
    // the sequence's length and block table are no kernel's output (set before the step): read, and the
    // warp's first block looked up, while the kernel that wrote q and this token's K/V row finishes
    const int heads = kv_heads * G, head0 = kvh * G, kv_len = pos0[s] + 1;
    // keys a split reads, from this sequence's own length (decode_keys_per_block in kernels/attention_launch.py):
    // a sequence splits alike whatever the batch beside it and whichever graph bucket runs it
    const int per_block = 64 * max(1, (kv_len + DEC_SPLITS * 64 - 1) / (DEC_SPLITS * 64));
    const int* tbl = table + table_off[s];  // this sequence's block table (paged.cuh)
    const int hk = kvh / kv_div, model_kv_heads = kv_heads / kv_div;
    const int per_warp = per_block / DEC_WARPS;
    // base is a multiple of DEC_ROUND (per_warp is): with blocks of DEC_ROUND keys or more a
    // round's keys lie in one block, found once a round
    const bool one_block = block_log2 >= DEC_ROUND_LOG2;
    // the row of the warp's first key of its first split, if it has keys
    const int begin0 = blockIdx.x * per_block + warp * per_warp;
    size_t next_row = one_block && begin0 < kv_len ? kv_row(tbl, begin0, hk, model_kv_heads, block_log2, D) : 0;
    after_producer();
    if (blockIdx.x * per_block < kv_len) {
        for (int i = threadIdx.x; i < G * D; i += DEC_WARPS * 32)
            qs[i / D][(i % D) / DQ][i % DQ] = __half2float(q[((size_t)s * heads + head0) * D + i]) * scale_log2;
        __syncthreads();
    }
    // the block's splits blockIdx.x, + gridDim.x, ... one after another, each its own partial
    for (int split = blockIdx.x; split < splits && split * per_block < kv_len; split += gridDim.x) {
        const int first = split * per_block, begin = first + warp * per_warp, end = min(begin + per_warp, kv_len);
        if (split != blockIdx.x) next_row = one_block && begin < end ? kv_row(tbl, begin, hk, model_kv_heads, block_log2, D) : 0;
        float m[G], l[G], o[G][DV];
#pragma unroll
        for (int h = 0; h < G; ++h) {
            m[h] = NEG_INF, l[h] = 0.f;
#pragma unroll
            for (int e = 0; e < DV; ++e) o[h][e] = 0.f;
        }
        // DEC_PREFETCH 1: a round's block is looked up in the table one round ahead, so that lookup is
        // in flight while the round before computes and a round's loads wait on no other memory
        // access; 0: each round after the first looks its block up, then loads. The arithmetic is the same.
#pragma unroll 1
        for (int base = begin; base < end; base += DEC_ROUND) {
#if DEC_PREFETCH
            const size_t round_row = next_row;
#else
            const size_t round_row = base == begin ? next_row : one_block ? kv_row(tbl, base, hk, model_kv_heads, block_log2, D) : 0;
#endif
            auto row = [&](int key) {
                return one_block ? round_row + (size_t)(key - base) * D
                                 : kv_row(tbl, key, hk, model_kv_heads, block_log2, D);
            };
            KVSlice<DQ, Q8_0> kr[4];
            KVSlice<DV, Q8_0> vr[DEC_ROUND];
#pragma unroll
            for (int qd = 0; qd < 4; ++qd) {
                const int key = base + 4 * qd + sub;
                kr[qd].load(k, k_scales, row(min(key, end - 1)) + chunk * DQ);  // unconditional: all in flight
                if (key >= end) kr[qd].clear();
            }
#pragma unroll
            for (int j = 0; j < DEC_ROUND; ++j) {
                if (base + j < end) vr[j].load(v, v_scales, row(base + j) + lane * DV);
                else vr[j].clear();
            }
#if DEC_PREFETCH
            if (one_block && base + DEC_ROUND < end)
                next_row = kv_row(tbl, base + DEC_ROUND, hk, model_kv_heads, block_log2, D);
#endif
            float sc[4][G];  // the score of key base + 4 qd + sub, head h
#pragma unroll
            for (int qd = 0; qd < 4; ++qd) {
                float kf[DQ];
                kr[qd].widen(kf);
#pragma unroll
                for (int h = 0; h < G; ++h) {
                    float acc = 0.f;
#pragma unroll
                    for (int e = 0; e < DQ; e += 4) {
                        const float4 qv = *reinterpret_cast<const float4*>(&qs[h][chunk][e]);
                        acc = fmaf(qv.x, kf[e], fmaf(qv.y, kf[e + 1], fmaf(qv.z, kf[e + 2], fmaf(qv.w, kf[e + 3], acc))));
                    }
                    acc *= kr[qd].scale();  // this lane's slice's scale, before the lanes' sum
                    acc += __shfl_xor_sync(0xffffffffu, acc, 1);
                    acc += __shfl_xor_sync(0xffffffffu, acc, 2);
                    acc += __shfl_xor_sync(0xffffffffu, acc, 4);
                    sc[qd][h] = base + 4 * qd + sub < end ? acc : NEG_INF;
                }
            }
#pragma unroll
            for (int h = 0; h < G; ++h) {  // online softmax over the round's 16 keys
                float mx = fmaxf(fmaxf(sc[0][h], sc[1][h]), fmaxf(sc[2][h], sc[3][h]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
                const float m_new = fmaxf(m[h], mx);  // finite: key `base` is present
                const float corr = exp2f(m[h] - m_new);
                float sum = 0.f;
#pragma unroll
                for (int qd = 0; qd < 4; ++qd) sum += (sc[qd][h] = exp2f(sc[qd][h] - m_new));
                sum += __shfl_xor_sync(0xffffffffu, sum, 8);
                sum += __shfl_xor_sync(0xffffffffu, sum, 16);
                l[h] = l[h] * corr + sum;
                m[h] = m_new;
#pragma unroll
                for (int e = 0; e < DV; ++e) o[h][e] *= corr;
            }
#pragma unroll
            for (int j = 0; j < DEC_ROUND; ++j) {  // key base + j: p from lane 8 (j % 4), round slot j / 4
                float vf[DV];
                vr[j].widen(vf);
#pragma unroll
                for (int h = 0; h < G; ++h) {
                    const float pj = __shfl_sync(0xffffffffu, sc[j / 4][h], 8 * (j % 4)) * vr[j].scale();
#pragma unroll
                    for (int e = 0; e < DV; ++e) o[h][e] = fmaf(pj, vf[e], o[h][e]);
                }
            }
        }
        // the block's partial: its warps merged (a warp with no keys has m = -inf and weighs 0)
        if (lane == 0)
#pragma unroll
            for (int h = 0; h < G; ++h) wm[warp][h] = m[h], wl[warp][h] = l[h];
#pragma unroll
        for (int h = 0; h < G; ++h)
#pragma unroll
            for (int e = 0; e < DV; ++e) wo[warp][h][lane * DV + e] = o[h][e];
        __syncthreads();
        for (int i = threadIdx.x; i < G * D; i += DEC_WARPS * 32) {
            const int h = i / D, dim = i % D;
            float mx = NEG_INF;
#pragma unroll
            for (int w = 0; w < DEC_WARPS; ++w) mx = fmaxf(mx, wm[w][h]);
            float num = 0.f, den = 0.f;
#pragma unroll
            for (int w = 0; w < DEC_WARPS; ++w) {
                const float a = exp2f(wm[w][h] - mx);
                num = fmaf(a, wo[w][h][dim], num);
                den = fmaf(a, wl[w][h], den);
            }
            const size_t row = ((size_t)s * heads + head0 + h) * splits + split;
            part_o[row * D + dim] = num;
            if (dim == 0) part_ml[row * 2] = mx, part_ml[row * 2 + 1] = den;
        }
        __syncthreads();  // wm, wl, wo are read before the next split's warps write them
    }
    __threadfence();  // the partials are visible to the block that merges
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(&counters[s * kv_heads + kvh], 1) == gridDim.x - 1;
    __syncthreads();
    if (!last) return;
    // the last block: weights of the used splits per head (a warp a head), then each output dim
    const int used = min(splits, (kv_len + per_block - 1) / per_block);
    for (int h = warp; h < G; h += DEC_WARPS) {
        const size_t row0 = ((size_t)s * heads + head0 + h) * splits;
        float mi[DEC_MAX_SPLITS / 32], li[DEC_MAX_SPLITS / 32], mx = NEG_INF;
#pragma unroll
        for (int r = 0; r < DEC_MAX_SPLITS / 32; ++r) {
            const int sp = lane + 32 * r;
            mi[r] = sp < used ? __ldcg(part_ml + (row0 + sp) * 2) : NEG_INF;
            li[r] = sp < used ? __ldcg(part_ml + (row0 + sp) * 2 + 1) : 0.f;
            mx = fmaxf(mx, mi[r]);
        }
        for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
        float den = 0.f;
#pragma unroll
        for (int r = 0; r < DEC_MAX_SPLITS / 32; ++r) {
            const float a = exp2f(mi[r] - mx);  // 0 for an unused split
            if (lane + 32 * r < used) weight[h][lane + 32 * r] = a;
            den = fmaf(a, li[r], den);
        }
        for (int off = 16; off > 0; off >>= 1) den += __shfl_xor_sync(0xffffffffu, den, off);
        if (lane == 0) inv_den[h] = 1.f / den;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < G * D; i += DEC_WARPS * 32) {
        const int h = i / D, dim = i % D;
        const size_t row0 = ((size_t)s * heads + head0 + h) * splits;
        float acc = 0.f;
#pragma unroll 8
        for (int sp = 0; sp < used; ++sp) acc = fmaf(weight[h][sp], __ldcg(part_o + (row0 + sp) * D + dim), acc);
        const __half r = __float2half(acc * inv_den[h]);
        out[((size_t)s * heads + head0 + h) * D + dim] = r;
        wo[0][h][dim] = __half2float(r);
    }
    if (threadIdx.x == 0) counters[s * kv_heads + kvh] = 0;  // ready for the next launch
    if (q8 == nullptr && q8k == nullptr) return;
    __syncthreads();  // the group's G * D outputs, in 8 bits for the output projection's matvec
    if (q8 != nullptr)
        for (int u = threadIdx.x; u < G * D / 32; u += DEC_WARPS * 32) {
            float vals[32];
#pragma unroll
            for (int j = 0; j < 32; ++j) vals[j] = (&wo[0][0][0])[32 * u + j];
            quantize_unit(vals, q8 + ((size_t)s * heads + head0) * D / 32 + u);
        }
    if constexpr (G * D % 256 == 0) {
        if (q8k != nullptr)
            for (int b = warp; b < G * D / 256; b += DEC_WARPS) {  // a warp a super-block
                float f[8];
#pragma unroll
                for (int j = 0; j < 8; ++j) f[j] = (&wo[0][0][0])[256 * b + 8 * lane + j];
                store_q8k(q8k + ((size_t)s * heads + head0) * D / 256 + b, f, lane);
            }
    }
}

// flash_decode_d<D>_g<G> reads an fp16 pool (k_scales, v_scales null), flash_decode_q8_d<D>_g<G> a q8_0 one
#define FLASH_DECODE_KIND(NAME, D, G, Q8_0)                                                                     \
    extern "C" __global__ void __launch_bounds__(DEC_WARPS * 32, G <= 4 && D <= 128 ? DEC_MIN_BLOCKS : 0)          \
        NAME(const __half* q, const void* k, const void* v, const __half* k_scales, const __half* v_scales,   \
             float* part_o, float* part_ml, __half* out, Q8* q8, Q8K* q8k, int* counters, const int* pos0,     \
             const int* table, const int* table_off, int kv_heads, int kv_div, int block_log2, float scale_log2, \
             int splits) {                                                                                      \
        flash_decode<D, G, Q8_0>(q, k, v, k_scales, v_scales, part_o, part_ml, out, q8, q8k, counters, pos0,   \
                               table, table_off, kv_heads, kv_div, block_log2, scale_log2, splits);          \
    }
#define FLASH_DECODE(D, G)                                          \
    FLASH_DECODE_KIND(flash_decode_d##D##_g##G, D, G, false)        \
    FLASH_DECODE_KIND(flash_decode_q8_d##D##_g##G, D, G, true)
#if IN_PART(1)
FLASH_DECODE(64, 1)
#endif
#if IN_PART(2)
FLASH_DECODE(64, 2)
#endif
#if IN_PART(3)
FLASH_DECODE(64, 3)
#endif
#if IN_PART(4)
FLASH_DECODE(64, 4)
#endif
#if IN_PART(5)
FLASH_DECODE(64, 5)
#endif
#if IN_PART(6)
FLASH_DECODE(64, 6)
#endif
#if IN_PART(7)
FLASH_DECODE(64, 7)
#endif
#if IN_PART(8)
FLASH_DECODE(64, 8)
#endif
#if IN_PART(10)
FLASH_DECODE(128, 1)
#endif
#if IN_PART(11)
FLASH_DECODE(128, 2)
#endif
#if IN_PART(12)
FLASH_DECODE(128, 3)
#endif
#if IN_PART(13)
FLASH_DECODE(128, 4)
#endif
#if IN_PART(14)
FLASH_DECODE(128, 5)
#endif
#if IN_PART(15)
FLASH_DECODE(128, 6)
#endif
#if IN_PART(16)
FLASH_DECODE(128, 7)
#endif
#if IN_PART(17)
FLASH_DECODE(128, 8)
#endif
#if IN_PART(19)
FLASH_DECODE(256, 1)
#endif
#if IN_PART(20)
FLASH_DECODE(256, 2)
#endif

// ---------------------------------------------------------------- a q8_0 pool's rows widened for a prompt chunk
// The prompt kernel reads fp16 tiles by cp.async; with a q8_0 pool a chunk's attention first widens
// the blocks its sequence holds into a scratch pool in table order (out block i = pool block
// blocks[i]), which the kernel then reads through the identity table. Reading 8-bit rows and writing
// fp16 ones costs a few percent of the chunk's attention at any depth (both grow with the keys; the
// attention also with the chunk). q: the pool's int8 values, scales its fp16 scales (paged.cuh);
// block_values = kv_heads * block * D. Eight values a thread.
extern "C" __global__ void widen_q8_0_blocks(const signed char* __restrict__ q, const __half* __restrict__ scales,
                                             __half* __restrict__ out, const int* __restrict__ blocks,
                                             long long octets, long long block_values) {
    after_producer();
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= octets) return;
    const long long e = 8 * i, b = e / block_values, within = e % block_values;
    const size_t at = (size_t)blocks[b] * block_values + within;
    const uint2 raw = *reinterpret_cast<const uint2*>(q + at);
    const float s = __half2float(scales[at / 32]);
    const signed char* c = reinterpret_cast<const signed char*>(&raw);
    __half2 h[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) h[j] = __floats2half2_rn((float)c[2 * j] * s, (float)c[2 * j + 1] * s);
    *reinterpret_cast<uint4*>(out + e) = *reinterpret_cast<const uint4*>(h);
}
