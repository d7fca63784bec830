// Flash attention for prompt chunks on Hopper (sm_90a): the same computation as attention.cu's
// flash_attention (same arguments, same grid's meaning, NumPy reference ArrayOps.attention) on the
// warpgroup MMA (wgmma), which mma.sync cannot drive at more than about a third of the tensor
// cores' rate on this chip.
//
// A block is two warpgroups (256 threads); each owns 64 of the block's 128 query rows (token x
// grouped head, as in attention.cu). Per tile of 128 keys: S = Q K^T (a 64 x 128 wgmma chain, Q
// and K read from shared memory), the running softmax on S in registers (online_softmax.cuh),
// O += P V (P from registers, V from shared memory N-major). The softmax of tile j + 1 runs while
// the tensor cores compute tile j's P V (FlashAttention-3's overlap within a warpgroup): a round
// issues S(j + 1) and P V(j) together and waits for the scores alone first. Q, K and V tiles sit in
// shared memory in the 128-byte swizzled layout the wgmma descriptors describe (wgmma.cuh); K/V
// tiles stream through three stages (P V's, the next scores', the one loading) by cp.async, each
// thread copying 16-byte pieces of rows found through the block table (a paged gather that the
// bulk tensor copy would need a tensor map per block for).
//
// Built by engine/kernels/sm90.py (NVRTC, sm_90a): no CUDA header, fp16 values as raw 16-bit words.
#include "kv_row.cuh"
#include "chunk_rows.cuh"
#include "wgmma.cuh"

constexpr int GROUPS = 2;             // warpgroups per block
constexpr int THREADS = 128 * GROUPS;
constexpr int BR = 64 * GROUPS;       // query rows per block: 64 per warpgroup (the wgmma's M)
constexpr int BC = 128;               // keys per tile: S is 64 x 128 per warpgroup, 64 fp32 registers a thread
constexpr int STAGES = 3;             // K/V tiles in shared memory: P V's, the next scores', the one loading
#ifndef V_LBO_IS_PANEL  // V's descriptor: 1 = lbo the next 64-value panel, sbo the next 8 keys (0: swapped)
#define V_LBO_IS_PANEL 1
#endif

template <int D>
struct Smem {  // bytes: the Q tile, then STAGES stages of (K tile, V tile); each 1024-aligned
    static constexpr int Q = BR * D * 2;
    static constexpr int TILE = BC * D * 2;
    static constexpr int BYTES = Q + STAGES * 2 * TILE + 1024;  // + the alignment of the dynamic base
};

using half_bits = unsigned short;

// Keys/values k0..k0+BC-1 of the block's K/V head into the stage at shared address `ks` (K) and ks + TILE (V),
// swizzled, each row through the sequence's block table; rows past key_end are zeros. A thread copies
// the same 16-byte piece (`chunk`) of rows r0, r0 + PASS, ...: rows a multiple of 8 apart, so its
// swizzled place moves by PASS rows of the tile from one to the next.
template <int D>
__device__ __forceinline__ void load_kv(unsigned ks, const half_bits* k, const half_bits* v, const ChunkRows& blk,
                                        int kv_heads, int block_log2, int k0) {
    constexpr int PASS = THREADS / (D / 8);  // rows the block copies at once: 16 (D = 128) or 32 (D = 64)
    static_assert(PASS % 8 == 0 && BC % PASS == 0, "a thread's rows share their swizzle");
    const int chunk = threadIdx.x % (D / 8), r0 = threadIdx.x / (D / 8);
    const unsigned at0 = ks + sw128(r0, chunk, BC);
#pragma unroll
    for (int i = 0; i < BC / PASS; ++i) {
        const int key = k0 + r0 + i * PASS;
        const bool ok = key < blk.key_end;
        const unsigned long long off = ok ? kv_row(blk.tbl, key, blk.kvh, kv_heads, block_log2, D) + chunk * 8 : 0;
        cp_async16_to(at0 + i * PASS * SW_ROW, k + off, ok);
        cp_async16_to(at0 + Smem<D>::TILE + i * PASS * SW_ROW, v + off, ok);
    }
}

// S (this warpgroup's 64 rows x BC keys) = Q K^T, issued (not waited for): D / 16 k-steps of 16 head
// dims, each a 32-byte step inside a 64-value panel. q_rows: the warpgroup's rows in Q's first panel.
template <int D>
__device__ __forceinline__ void scores(float* sc, unsigned q_rows, unsigned ks) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        const unsigned panel = kk >> 2, step = (kk & 3) * 32;
        wgmma_ss_n128(sc, sw128_desc(q_rows + panel * BR * SW_ROW + step, 16, 8 * SW_ROW),
                      sw128_desc(ks + panel * BC * SW_ROW + step, 16, 8 * SW_ROW), kk > 0);
    }
}

// O (this warpgroup's 64 rows x D) += P V, issued: BC / 16 k-steps of 16 keys (16 rows of the V tile,
// 2048 bytes on), V read N-major (its rows are the k index).
template <int D>
__device__ __forceinline__ void values(float* o, uint32_t (*pa)[4], unsigned vs) {
#if V_LBO_IS_PANEL
    constexpr unsigned V_LBO = BC * SW_ROW, V_SBO = 8 * SW_ROW;
#else
    constexpr unsigned V_LBO = 8 * SW_ROW, V_SBO = BC * SW_ROW;
#endif
#pragma unroll
    for (int kk = 0; kk < BC / 16; ++kk) {
        const uint64_t desc = sw128_desc(vs + kk * 16 * SW_ROW, V_LBO, V_SBO);
        if constexpr (D == 128) wgmma_rs_n128_t(o, pa[kk], desc, 1);
        else wgmma_rs_n64_t(o, pa[kk], desc, 1);
    }
}

template <int D>
__device__ __forceinline__ void flash_attention_sm90(const half_bits* __restrict__ q, const half_bits* __restrict__ k,
                                                     const half_bits* __restrict__ v, half_bits* __restrict__ out,
                                                     const int* __restrict__ q_start, const int* __restrict__ pos0,
                                                     const int* __restrict__ table, const int* __restrict__ table_off,
                                                     int heads, int kv_heads, int block_log2, float scale_log2) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const unsigned base = (smem_addr(smem_raw) + 1023) & ~1023u;  // the 128-byte swizzle's atoms are 1024-aligned
    constexpr int TILE = Smem<D>::TILE;
    const unsigned qs = base, stage0 = base + Smem<D>::Q;

    ChunkRows blk;
    if (!chunk_rows<BR, BC>(blk, q_start, pos0, table, table_off, heads, kv_heads)) return;
    const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, g = (threadIdx.x & 31) >> 2;

    // ---- the query rows (zeros past the chunk's) and K/V tile 0: one async group; tile 1: the next
    for (int c = threadIdx.x; c < BR * D / 8; c += THREADS) {
        const int r = c / (D / 8), chunk = c % (D / 8), row = blk.row0 + r;
        const bool ok = row < blk.rows;
        const int tok = ok ? row / blk.group : 0, head = blk.kvh * blk.group + (ok ? row % blk.group : 0);
        const unsigned long long at = ((unsigned long long)(q_start[blk.s] + tok) * heads + head) * D + chunk * 8;
        cp_async16_to(qs + sw128(r, chunk, BR), q + at, ok);
    }
    load_kv<D>(stage0, k, v, blk, kv_heads, block_log2, 0);
    cp_async_commit();
    if (blk.tiles > 1) {
        load_kv<D>(stage0 + 2 * TILE, k, v, blk, kv_heads, block_log2, BC);
        cp_async_commit();
        cp_async_wait<1>();
    } else {
        cp_async_wait<0>();
    }
    fence_proxy_async();  // the tiles, written through cp.async, are read next by the tensor cores
    __syncthreads();

    // the two rows this thread holds (rows g and g + 8 of its warp's 16): their absolute positions
    const int r_a = wg * 64 + warp * 16 + g;
    const int pos_a = blk.position(r_a), pos_b = blk.position(r_a + 8);
    const unsigned q_rows = qs + wg * 64 * SW_ROW;  // this warpgroup's 64 rows in each Q panel
    RowState ra, rb;
    float corr_a, corr_b;

    // ---- tile 0's scores and probabilities; then each round j issues tile j + 1's scores and tile j's
    // P V together, and computes tile j + 1's softmax while P V runs on the tensor cores
    float sc[BC / 2];
    wgmma_fence();
    scores<D>(sc, q_rows, stage0);
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs<BC / 2>(sc);
    online_softmax<BC>(sc, ra, rb, 0, blk.masked(0, BC), pos_a, pos_b, blk.key_end, scale_log2, corr_a, corr_b);
    uint32_t pa[BC / 16][4];
#pragma unroll
    for (int kk = 0; kk < BC / 16; ++kk) p_fragment(sc, kk, pa[kk]);
    float o[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; ++i) o[i] = 0.f;

    for (int j = 0; j + 1 < blk.tiles; ++j) {
        cp_async_wait<0>();  // tile j + 1 has landed (this thread's copies; the barrier makes it everyone's)
        fence_proxy_async();
        __syncthreads();  // ... and every warpgroup's P V of tile j - 1 is done: its stage may be loaded again
        wgmma_fence();
        scores<D>(sc, q_rows, stage0 + ((j + 1) % STAGES) * 2 * TILE);
        wgmma_commit();
        values<D>(o, pa, stage0 + (j % STAGES) * 2 * TILE + TILE);
        wgmma_commit();
        if (j + 2 < blk.tiles) {  // tile j + 2 loads while the tensor cores work and through the next round
            load_kv<D>(stage0 + ((j + 2) % STAGES) * 2 * TILE, k, v, blk, kv_heads, block_log2, (j + 2) * BC);
            cp_async_commit();
        }
        wgmma_wait<1>();  // tile j + 1's scores (P V may still run)
        fence_regs<BC / 2>(sc);
        const int k0 = (j + 1) * BC;
        online_softmax<BC>(sc, ra, rb, k0, blk.masked(k0, BC), pos_a, pos_b, blk.key_end, scale_log2, corr_a, corr_b);
        wgmma_wait<0>();
        fence_regs<D / 2>(o);
        fence_regs<BC / 4>(&pa[0][0]);  // read by the MMA until now: not to be reused before
        rescale<D / 2>(o, corr_a, corr_b);
#pragma unroll
        for (int kk = 0; kk < BC / 16; ++kk) p_fragment(sc, kk, pa[kk]);
    }
    wgmma_fence();  // the last tile's P V
    values<D>(o, pa, stage0 + ((blk.tiles - 1) % STAGES) * 2 * TILE + TILE);
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs<D / 2>(o);

    write_rows<D>(out, o, blk, q_start, heads, r_a, ra, rb);
}

#define FLASH_ATTENTION_SM90(D)                                                                                \
    extern "C" __global__ void __launch_bounds__(THREADS, 1)                                                   \
        flash_attention_sm90_d##D(const half_bits* q, const half_bits* k, const half_bits* v, half_bits* out,   \
                                  const int* q_start, const int* pos0, const int* table, const int* table_off, \
                                  int heads, int kv_heads, int block_log2, float scale_log2) {                 \
        flash_attention_sm90<D>(q, k, v, out, q_start, pos0, table, table_off, heads, kv_heads, block_log2,    \
                                scale_log2);                                                                   \
    }
FLASH_ATTENTION_SM90(64)
FLASH_ATTENTION_SM90(128)
