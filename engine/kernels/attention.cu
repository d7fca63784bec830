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
// Measured on an H200 (tools/gpu_kernels_check.py): 145-153 TFLOP/s on a 2048-token chunk with no
// prefix, 215-227 at depths of 14K-63K: about 30% of the 720-758 cuBLAS reaches on the same card
// (mma.sync; a wgmma/TMA kernel is what would close the gap).
//
// Grid: (row tiles, kv_heads, sequences); a block of 4 warps owns 64 rows, each warp 16. K/V tiles
// of 64 keys stream through two shared-memory stages (cp.async), fragments come by ldmatrix.
#include <cuda_fp16.h>
using uint32_t = unsigned int;  // NVRTC has no <stdint.h>

constexpr int WARPS = 4;
constexpr int BR = 16 * WARPS;  // query rows per block (16 per warp: the mma's M)
constexpr int BC = 64;          // keys per tile: S is 16 x 64 per warp = 32 fp32 registers a thread
constexpr int PAD = 8;          // fp16 padding per shared row: rows land on distinct banks
#define NEG_INF (-__int_as_float(0x7f800000))  // -inf (NVRTC has no <math.h> INFINITY)
static_assert(BR == BC, "stage 1's K tile also stages the Q rows");

__device__ __forceinline__ void mma_16x8x16(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t ld32(const __half* p) { return *reinterpret_cast<const uint32_t*>(p); }

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
}

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared without passing through registers; zero-filled when !valid.
__device__ __forceinline__ void cp_async16(__half* dst, const __half* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(valid ? 16 : 0));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// Four 8x8 fp16 matrices from shared memory, in mma fragment layout (lanes 8i..8i+7 give the
// row addresses of matrix i); .trans hands each thread the transposed elements.
__device__ __forceinline__ void ldmatrix_x4(uint32_t* r, const __half* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t* r, const __half* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}

template <int D>
struct Tiles {  // dynamic shared memory: two stages of (K tile, V tile), each BC x ROW fp16
    static constexpr int ROW = D + PAD;
    static constexpr int TILE = BC * ROW;
    static constexpr int BYTES = 2 * 2 * TILE * 2;
};

// Keys/values k0..k0+BC-1 of one head into a stage, asynchronously; rows past key_end are zeros.
template <int D>
__device__ __forceinline__ void load_kv_tile(__half* ks, __half* vs, const __half* kb, const __half* vb, int k0,
                                             int key_end) {
    for (int c = threadIdx.x; c < BC * D / 8; c += WARPS * 32) {
        const int r = c / (D / 8), col = (c % (D / 8)) * 8;
        const bool ok = k0 + r < key_end;
        const size_t off = ok ? (size_t)(k0 + r) * D + col : 0;
        cp_async16(ks + r * Tiles<D>::ROW + col, kb + off, ok);
        cp_async16(vs + r * Tiles<D>::ROW + col, vb + off, ok);
    }
}

// q, out: (tokens, heads, D) fp16; k, v: this layer's cache, sequence s at k + kv_off[s]:
// (kv_heads, ctx, D) fp16. scale_log2 = log2(e) / sqrt(D). Dynamic shared memory: Tiles<D>::BYTES.
template <int D>
__device__ __forceinline__ void flash_attention(const __half* __restrict__ q, const __half* __restrict__ k,
                                                const __half* __restrict__ v, __half* __restrict__ out,
                                                const int* __restrict__ q_start, const int* __restrict__ pos0,
                                                const long long* __restrict__ kv_off, int heads, int kv_heads,
                                                int ctx, float scale_log2) {
    extern __shared__ __align__(16) __half smem[];
    constexpr int ROW = Tiles<D>::ROW, TILE = Tiles<D>::TILE;

    const int s = blockIdx.z, kvh = blockIdx.y, group = heads / kv_heads;
    const int n = q_start[s + 1] - q_start[s], rows = n * group;
    const int row0 = (gridDim.x - 1 - blockIdx.x) * BR;  // heaviest (latest) tiles first
    if (row0 >= rows) return;
    const int p0 = pos0[s];
    const __half* kb = k + kv_off[s] + (size_t)kvh * ctx * D;
    const __half* vb = v + kv_off[s] + (size_t)kvh * ctx * D;
    const int key_end = p0 + min(n - 1, (row0 + BR - 1) / group) + 1;  // keys this block can see
    const int min_pos = p0 + row0 / group;  // keys up to here are visible to every row of the block
    const int tiles = (key_end + BC - 1) / BC;

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;

    // ---- tile 0 starts loading into stage 0 while the query rows are staged in stage 1
    load_kv_tile<D>(smem, smem + TILE, kb, vb, 0, key_end);
    cp_async_commit();
    __half* qs = smem + 2 * TILE;
    for (int c = threadIdx.x; c < BR * D / 8; c += WARPS * 32) {
        const int r = c / (D / 8), col = (c % (D / 8)) * 8, row = row0 + r;
        uint4 val = make_uint4(0, 0, 0, 0);
        if (row < rows) {
            const int tok = row / group, head = kvh * group + row % group;
            val = *reinterpret_cast<const uint4*>(q + ((size_t)(q_start[s] + tok) * heads + head) * D + col);
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
    const int pos_a = p0 + (row0 + wr + g) / group, pos_b = p0 + (row0 + wr + g + 8) / group;
    float o[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float m_a = NEG_INF, m_b = NEG_INF, l_a = 0.f, l_b = 0.f;

    for (int j = 0; j < tiles; ++j) {
        const int k0 = j * BC;
        if (j + 1 < tiles) {  // the next tile loads while this one is computed
            const int next = ((j + 1) & 1) * 2 * TILE;
            load_kv_tile<D>(smem + next, smem + next + TILE, kb, vb, k0 + BC, key_end);
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
        // ---- scale into the log2 domain; mask only the tiles that reach the diagonal or the end
        const bool masked = k0 + BC - 1 > min_pos || k0 + BC > key_end;
        float tmax_a = NEG_INF, tmax_b = NEG_INF;
#pragma unroll
        for (int nt = 0; nt < BC / 8; ++nt) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int key = k0 + nt * 8 + 2 * t + e;
                sc[nt][e] = !masked || (key <= pos_a && key < key_end) ? sc[nt][e] * scale_log2 : NEG_INF;
                sc[nt][2 + e] = !masked || (key <= pos_b && key < key_end) ? sc[nt][2 + e] * scale_log2 : NEG_INF;
                tmax_a = fmaxf(tmax_a, sc[nt][e]);
                tmax_b = fmaxf(tmax_b, sc[nt][2 + e]);
            }
        }
        // a row's scores are spread over the 4 threads of a quad
        tmax_a = fmaxf(tmax_a, __shfl_xor_sync(0xffffffffu, tmax_a, 1));
        tmax_a = fmaxf(tmax_a, __shfl_xor_sync(0xffffffffu, tmax_a, 2));
        tmax_b = fmaxf(tmax_b, __shfl_xor_sync(0xffffffffu, tmax_b, 1));
        tmax_b = fmaxf(tmax_b, __shfl_xor_sync(0xffffffffu, tmax_b, 2));
        const float new_a = fmaxf(m_a, tmax_a), new_b = fmaxf(m_b, tmax_b);
        // a row with no visible key yet keeps max -inf: use 0 so exp2 gives 0, not NaN
        const float base_a = new_a == NEG_INF ? 0.f : new_a, base_b = new_b == NEG_INF ? 0.f : new_b;
        const float corr_a = exp2f(m_a - base_a), corr_b = exp2f(m_b - base_b);
        m_a = new_a;
        m_b = new_b;
        l_a *= corr_a;
        l_b *= corr_b;
#pragma unroll
        for (int i = 0; i < D / 8; ++i) {
            o[i][0] *= corr_a;
            o[i][1] *= corr_a;
            o[i][2] *= corr_b;
            o[i][3] *= corr_b;
        }
        // ---- P = exp2(S - m) straight from registers (the C layout is the A layout), O += P V
        // with V fragments by transposing ldmatrix, two dim tiles per load
#pragma unroll
        for (int kk = 0; kk < BC / 16; ++kk) {
            float p[2][4];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                p[h][0] = exp2f(sc[2 * kk + h][0] - base_a);
                p[h][1] = exp2f(sc[2 * kk + h][1] - base_a);
                p[h][2] = exp2f(sc[2 * kk + h][2] - base_b);
                p[h][3] = exp2f(sc[2 * kk + h][3] - base_b);
                l_a += p[h][0] + p[h][1];
                l_b += p[h][2] + p[h][3];
            }
            const uint32_t pa[4] = {pack_half2(p[0][0], p[0][1]), pack_half2(p[0][2], p[0][3]),
                                    pack_half2(p[1][0], p[1][1]), pack_half2(p[1][2], p[1][3])};
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

    // ---- normalize and write the rows this thread holds
    l_a += __shfl_xor_sync(0xffffffffu, l_a, 1);
    l_a += __shfl_xor_sync(0xffffffffu, l_a, 2);
    l_b += __shfl_xor_sync(0xffffffffu, l_b, 1);
    l_b += __shfl_xor_sync(0xffffffffu, l_b, 2);
#pragma unroll
    for (int half_row = 0; half_row < 2; ++half_row) {
        const int row = row0 + wr + g + 8 * half_row;
        if (row >= rows) continue;
        const float inv = 1.f / (half_row ? l_b : l_a);
        const int tok = row / group, head = kvh * group + row % group;
        __half* dst = out + ((size_t)(q_start[s] + tok) * heads + head) * D;
#pragma unroll
        for (int dn = 0; dn < D / 8; ++dn)
            *reinterpret_cast<__half2*>(dst + dn * 8 + 2 * t) =
                __floats2half2_rn(o[dn][2 * half_row] * inv, o[dn][2 * half_row + 1] * inv);
    }
}

#define FLASH_ATTENTION(D)                                                                                     \
    extern "C" __global__ void __launch_bounds__(WARPS * 32)                                                   \
        flash_attention_d##D(const __half* q, const __half* k, const __half* v, __half* out, const int* q_start, \
                             const int* pos0, const long long* kv_off, int heads, int kv_heads, int ctx,       \
                             float scale_log2) {                                                               \
        flash_attention<D>(q, k, v, out, q_start, pos0, kv_off, heads, kv_heads, ctx, scale_log2);             \
    }
FLASH_ATTENTION(64)
FLASH_ATTENTION(128)

// ---------------------------------------------------------------- flash-decoding: one query token
// A decode step has one query token per sequence: too little work for the prompt kernel's 64-row
// tiles (it would give each K/V head one block for the whole context). Here the key range is split
// across blocks: block (split, kv head, sequence) reads keys [split * SPLIT, +SPLIT) once for the
// `group` query heads that share them, each of its warps keeping its own partial softmax state;
// flash_decode_combine then merges the partials. The grid may be larger than the keys (so that a
// captured graph serves a range of lengths): blocks past the end write an empty partial.
// Measured on an H200: 234 us a layer at 46,832 positions, 587 us at 131,071 (8 K/V heads of 128):
// 0.82-0.91 TB/s of the ~4.3 TB/s the card copies at. Latency-bound still.
constexpr int DEC_WARPS = 4;
constexpr int DEC_KEYS_PER_WARP = 64;  // two rounds of 32 keys, one key per lane: 256 keys a block
constexpr int MAX_GROUP = 8;  // query heads per K/V head

// q: (sequences, heads, D) fp16 (one token each), at position pos0[s]; keys 0..pos0[s] are visible.
// part_o: (sequences, heads, partials, D) fp32 unnormalized; part_ml: (sequences, heads, partials, 2)
// the running max (log2 domain) and sum; partials = gridDim.x * DEC_WARPS.
template <int D>
__device__ __forceinline__ void flash_decode(const __half* __restrict__ q, const __half* __restrict__ k,
                                             const __half* __restrict__ v, float* __restrict__ part_o,
                                             float* __restrict__ part_ml, const int* __restrict__ pos0,
                                             const long long* __restrict__ kv_off, int heads, int kv_heads, int ctx,
                                             float scale_log2) {
    constexpr int DL = D / 32;  // dims per lane in the P V product
    __shared__ float qs[MAX_GROUP][D];
    const int s = blockIdx.z, kvh = blockIdx.y, group = heads / kv_heads;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int kv_len = pos0[s] + 1, partials = gridDim.x * DEC_WARPS;
    const int part = blockIdx.x * DEC_WARPS + warp;
    for (int i = threadIdx.x; i < group * D; i += DEC_WARPS * 32)
        qs[i / D][i % D] = __half2float(q[((size_t)s * heads + kvh * group + i / D) * D + i % D]);
    __syncthreads();
    const __half* kb = k + kv_off[s] + (size_t)kvh * ctx * D;
    const __half* vb = v + kv_off[s] + (size_t)kvh * ctx * D;

    float m[MAX_GROUP], l[MAX_GROUP], o[MAX_GROUP][DL];
#pragma unroll
    for (int h = 0; h < MAX_GROUP; ++h) {
        m[h] = NEG_INF;
        l[h] = 0.f;
#pragma unroll
        for (int j = 0; j < DL; ++j) o[h][j] = 0.f;
    }
    const int first = part * DEC_KEYS_PER_WARP;
#pragma unroll 1
    for (int base = first; base < min(first + DEC_KEYS_PER_WARP, kv_len); base += 32) {
        const int key = base + lane;
        float sc[MAX_GROUP];
#pragma unroll
        for (int h = 0; h < MAX_GROUP; ++h) sc[h] = 0.f;
        if (key < kv_len) {  // this lane's key against every query head of the group
            const uint4* kr = reinterpret_cast<const uint4*>(kb + (size_t)key * D);
            constexpr int BATCH = D / 8 < 8 ? D / 8 : 8;  // 16-byte loads in flight before any use
#pragma unroll
            for (int c0 = 0; c0 < D / 8; c0 += BATCH) {
                uint4 raw[BATCH];
#pragma unroll
                for (int c = 0; c < BATCH; ++c) raw[c] = kr[c0 + c];
#pragma unroll
                for (int c = 0; c < BATCH; ++c) {
                    const __half2* h2 = reinterpret_cast<const __half2*>(&raw[c]);
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const float2 f = __half22float2(h2[e]);
#pragma unroll
                        for (int h = 0; h < MAX_GROUP; ++h)
                            if (h < group)
                                sc[h] += qs[h][(c0 + c) * 8 + 2 * e] * f.x + qs[h][(c0 + c) * 8 + 2 * e + 1] * f.y;
                    }
                }
            }
        }
        float p[MAX_GROUP];
#pragma unroll
        for (int h = 0; h < MAX_GROUP; ++h) {
            if (h >= group) continue;
            const float x = key < kv_len ? sc[h] * scale_log2 : NEG_INF;
            float mx = x;
            for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
            const float m_new = fmaxf(m[h], mx);  // finite: the round holds at least one key
            p[h] = exp2f(x - m_new);
            float sum = p[h];
            for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
            const float corr = exp2f(m[h] - m_new);
            l[h] = l[h] * corr + sum;
            m[h] = m_new;
#pragma unroll
            for (int j = 0; j < DL; ++j) o[h][j] *= corr;
        }
        // P V: lanes now cover the head dims, keys come one by one (p by shuffle); the 32 rows'
        // slices are all loaded before the first is used, so the loads overlap
        const int n_keys = min(32, kv_len - base);
        __half2 vh[32][DL / 2];
#pragma unroll
        for (int j = 0; j < 32; ++j) {
            const __half2* vr = reinterpret_cast<const __half2*>(vb + (size_t)(base + j) * D + lane * DL);
#pragma unroll
            for (int e = 0; e < DL / 2; ++e) vh[j][e] = j < n_keys ? vr[e] : __float2half2_rn(0.f);
        }
#pragma unroll
        for (int j = 0; j < 32; ++j) {
            float vf[DL];
#pragma unroll
            for (int e = 0; e < DL / 2; ++e) {
                const float2 f = __half22float2(vh[j][e]);
                vf[2 * e] = f.x;
                vf[2 * e + 1] = f.y;
            }
#pragma unroll
            for (int h = 0; h < MAX_GROUP; ++h) {
                if (h >= group) continue;
                const float pj = __shfl_sync(0xffffffffu, p[h], j);  // 0 past the last key
#pragma unroll
                for (int d = 0; d < DL; ++d) o[h][d] += pj * vf[d];
            }
        }
    }
#pragma unroll
    for (int h = 0; h < MAX_GROUP; ++h) {
        if (h >= group) continue;
        const size_t row = ((size_t)s * heads + kvh * group + h) * partials + part;
#pragma unroll
        for (int d = 0; d < DL; ++d) part_o[row * D + lane * DL + d] = o[h][d];
        if (lane == 0) {
            part_ml[row * 2] = m[h];
            part_ml[row * 2 + 1] = l[h];
        }
    }
}

#define FLASH_DECODE(D)                                                                                       \
    extern "C" __global__ void __launch_bounds__(DEC_WARPS * 32)                                              \
        flash_decode_d##D(const __half* q, const __half* k, const __half* v, float* part_o, float* part_ml,   \
                          const int* pos0, const long long* kv_off, int heads, int kv_heads, int ctx,         \
                          float scale_log2) {                                                                 \
        flash_decode<D>(q, k, v, part_o, part_ml, pos0, kv_off, heads, kv_heads, ctx, scale_log2);            \
    }
FLASH_DECODE(64)
FLASH_DECODE(128)

// Merge the partials of one (sequence, head): out = sum_i 2^(m_i - M) o_i / sum_i 2^(m_i - M) l_i.
// Only the partials that hold keys are read (the rest of a graph's grid is empty). Block: (D,
// COMBINE_GROUPS) threads; group g folds partials g, g + COMBINE_GROUPS, ... with an online max,
// then the groups are merged through shared memory (one thread a dim walking 700 partials alone
// was most of a long-context decode step).
constexpr int COMBINE_GROUPS = 8;

extern "C" __global__ void flash_decode_combine(const float* __restrict__ part_o, const float* __restrict__ part_ml,
                                                __half* __restrict__ out, const int* __restrict__ pos0,
                                                int heads, int partials, int d) {
    __shared__ float gm[COMBINE_GROUPS][128], gnum[COMBINE_GROUPS][128], gden[COMBINE_GROUPS][128];
    const int s = blockIdx.y, head = blockIdx.x, dim = threadIdx.x, g = threadIdx.y;
    const int used = min(partials, (pos0[s] + 1 + DEC_KEYS_PER_WARP - 1) / DEC_KEYS_PER_WARP);
    const size_t row0 = ((size_t)s * heads + head) * partials;
    float m = NEG_INF, num = 0.f, den = 0.f;
#pragma unroll 4
    for (int i = g; i < used; i += COMBINE_GROUPS) {  // a used partial holds a key: its max is finite
        const float mi = part_ml[(row0 + i) * 2], li = part_ml[(row0 + i) * 2 + 1];
        const float oi = part_o[(row0 + i) * d + dim];
        const float mn = fmaxf(m, mi), a = exp2f(m - mn), b = exp2f(mi - mn);
        num = num * a + oi * b;
        den = den * a + li * b;
        m = mn;
    }
    gm[g][dim] = m;
    gnum[g][dim] = num;
    gden[g][dim] = den;
    __syncthreads();
    if (g != 0) return;
    float mx = NEG_INF;
#pragma unroll
    for (int k = 0; k < COMBINE_GROUPS; ++k) mx = fmaxf(mx, gm[k][dim]);
    float n_all = 0.f, d_all = 0.f;
#pragma unroll
    for (int k = 0; k < COMBINE_GROUPS; ++k) {  // a group with no partial: m = -inf, weight 0
        const float w = exp2f(gm[k][dim] - mx);
        n_all += gnum[k][dim] * w;
        d_all += gden[k][dim] * w;
    }
    out[((size_t)s * heads + head) * d + dim] = __float2half(n_all / d_all);
}
