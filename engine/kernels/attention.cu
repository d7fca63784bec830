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
// Grid: (row tiles, kv_heads, sequences); a block of 4 warps owns 64 rows, each warp 16.
#include <cuda_fp16.h>
using uint32_t = unsigned int;  // NVRTC has no <stdint.h>

constexpr int WARPS = 4;
constexpr int BR = 16 * WARPS;  // query rows per block (16 per warp: the mma's M)
constexpr int BC = 64;          // keys per tile: S is 16 x 64 per warp = 32 fp32 registers a thread
constexpr int PAD = 8;          // fp16 padding per shared row: rows land on distinct banks
#define NEG_INF (-__int_as_float(0x7f800000))  // -inf (NVRTC has no <math.h> INFINITY)
static_assert(BR == BC, "the K tile buffer also stages the Q rows");

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

// q, out: (tokens, heads, D) fp16; k, v: this layer's cache, sequence s at k + kv_off[s]:
// (kv_heads, ctx, D) fp16. scale_log2 = log2(e) / sqrt(D).
template <int D>
__global__ void __launch_bounds__(WARPS * 32)
flash_attention(const __half* __restrict__ q, const __half* __restrict__ k, const __half* __restrict__ v,
                __half* __restrict__ out, const int* __restrict__ q_start, const int* __restrict__ pos0,
                const long long* __restrict__ kv_off, int heads, int kv_heads, int ctx, float scale_log2) {
    __shared__ __align__(16) __half ks[BC][D + PAD];   // K tile, row = key (also stages Q)
    __shared__ __align__(16) __half vt[D][BC + PAD];   // V tile transposed, row = dim

    const int s = blockIdx.z, kvh = blockIdx.y, group = heads / kv_heads;
    const int n = q_start[s + 1] - q_start[s], rows = n * group;
    const int row0 = (gridDim.x - 1 - blockIdx.x) * BR;  // heaviest (latest) tiles first
    if (row0 >= rows) return;
    const int p0 = pos0[s];
    const __half* kb = k + kv_off[s] + (size_t)kvh * ctx * D;
    const __half* vb = v + kv_off[s] + (size_t)kvh * ctx * D;
    const int last_token = min(n - 1, (row0 + BR - 1) / group);
    const int key_end = p0 + last_token + 1;  // keys this block can see

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;

    // ---- stage the block's 64 query rows in shared memory, then into registers (A fragments)
    for (int c = threadIdx.x; c < BR * D / 8; c += WARPS * 32) {
        const int r = c / (D / 8), col = (c % (D / 8)) * 8, row = row0 + r;
        uint4 val = make_uint4(0, 0, 0, 0);
        if (row < rows) {
            const int tok = row / group, head = kvh * group + row % group;
            val = *reinterpret_cast<const uint4*>(q + ((size_t)(q_start[s] + tok) * heads + head) * D + col);
        }
        *reinterpret_cast<uint4*>(&ks[r][col]) = val;
    }
    __syncthreads();
    uint32_t qa[D / 16][4];
    const int wr = warp * 16;  // this warp's first row within the block
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        qa[kk][0] = ld32(&ks[wr + g][kk * 16 + 2 * t]);
        qa[kk][1] = ld32(&ks[wr + g + 8][kk * 16 + 2 * t]);
        qa[kk][2] = ld32(&ks[wr + g][kk * 16 + 8 + 2 * t]);
        qa[kk][3] = ld32(&ks[wr + g + 8][kk * 16 + 8 + 2 * t]);
    }
    __syncthreads();

    // the two rows this thread holds (fragment rows g and g + 8): their absolute positions
    const int pos_a = p0 + (row0 + wr + g) / group, pos_b = p0 + (row0 + wr + g + 8) / group;
    float o[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float m_a = NEG_INF, m_b = NEG_INF, l_a = 0.f, l_b = 0.f;

    for (int k0 = 0; k0 < key_end; k0 += BC) {
        // ---- K tile (coalesced rows) and V tile transposed (consecutive threads, consecutive keys)
        for (int c = threadIdx.x; c < BC * D / 8; c += WARPS * 32) {
            const int kr = c / (D / 8), col = (c % (D / 8)) * 8;
            uint4 val = make_uint4(0, 0, 0, 0);
            if (k0 + kr < key_end) val = *reinterpret_cast<const uint4*>(kb + (size_t)(k0 + kr) * D + col);
            *reinterpret_cast<uint4*>(&ks[kr][col]) = val;
            const int vr = c % BC, vcol = (c / BC) * 8;
            uint4 vv = make_uint4(0, 0, 0, 0);
            if (k0 + vr < key_end) vv = *reinterpret_cast<const uint4*>(vb + (size_t)(k0 + vr) * D + vcol);
            const __half* h = reinterpret_cast<const __half*>(&vv);
#pragma unroll
            for (int i = 0; i < 8; ++i) vt[vcol + i][vr] = h[i];
        }
        __syncthreads();

        // ---- S = Q K^T (16 x 64 per warp), in the log2 domain, masked
        float sc[BC / 8][4];
#pragma unroll
        for (int nt = 0; nt < BC / 8; ++nt) {
            sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.f;
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk)
                mma_16x8x16(sc[nt], qa[kk], ld32(&ks[nt * 8 + g][kk * 16 + 2 * t]),
                            ld32(&ks[nt * 8 + g][kk * 16 + 8 + 2 * t]));
        }
        float tmax_a = NEG_INF, tmax_b = NEG_INF;
#pragma unroll
        for (int nt = 0; nt < BC / 8; ++nt) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int key = k0 + nt * 8 + 2 * t + e;
                sc[nt][e] = key <= pos_a && key < key_end ? sc[nt][e] * scale_log2 : NEG_INF;
                sc[nt][2 + e] = key <= pos_b && key < key_end ? sc[nt][2 + e] * scale_log2 : NEG_INF;
                tmax_a = fmaxf(tmax_a, sc[nt][e]);
                tmax_b = fmaxf(tmax_b, sc[nt][2 + e]);
            }
        }
        // a row's 64 scores are spread over the 4 threads of a quad
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
        // ---- P = exp2(S - m), then O += P V with P straight from registers (C layout = A layout)
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
            for (int dn = 0; dn < D / 8; ++dn)
                mma_16x8x16(o[dn], pa, ld32(&vt[dn * 8 + g][kk * 16 + 2 * t]),
                            ld32(&vt[dn * 8 + g][kk * 16 + 8 + 2 * t]));
        }
        __syncthreads();
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

template __global__ void flash_attention<64>(const __half*, const __half*, const __half*, __half*, const int*,
                                             const int*, const long long*, int, int, int, float);
template __global__ void flash_attention<128>(const __half*, const __half*, const __half*, __half*, const int*,
                                              const int*, const long long*, int, int, int, float);
