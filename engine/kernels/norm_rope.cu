// Elementwise work of the half-precision forward pass, each fused into one kernel:
// residual add + RMSNorm (the hybrids' gated feed-forward sum with it), (per-head Q/K RMSNorm +) RoPE + K/V cache
// write, SwiGLU. Activations are fp16; the residual
// stream and the norm statistics are fp32. The norm and SwiGLU also write their rows in 8 bits
// (q8.cuh, and q8k.cuh's super-blocks for sbq.cu) when asked: a decode step's quantized matvecs read that, with no
// kernel of its own.
// NumPy references: engine/backend.py ArrayOps.
#include <cuda_fp16.h>

#include "add_norm.cuh"
#include "paged.cuh"
#include "pdl.cuh"
#include "q8.cuh"
#include "q8k.cuh"
#include "shared_gate.cuh"
#include "swiglu.cuh"

// The residual add and RMSNorm of row `row` (add_rms_norm's body, the delta's source a functor add(v, o): v[0..8)
// += the row's delta at octet o). One block a row, eight values a thread at a time (octet o = thread + 256 i),
// kept in registers between the sum of squares and the outputs (four threads a Q8 unit, a warp a Q8K super-block:
// q8k only where dim is a multiple of 256, so that a warp's octets are all in the row or none). wv: the thread's
// octets of the norm's weights, read before the wait for the kernel that wrote the delta (no kernel writes them).
template <class AddDelta>
__device__ __forceinline__ void norm_row(float* __restrict__ x, const float (&wv)[NORM_OCTETS][8], __half* __restrict__ out,
                                         Q8* __restrict__ q8, Q8K* __restrict__ q8k, int dim, float eps, size_t row,
                                         AddDelta add) {
    const int octets = dim / 8;
    float v[NORM_OCTETS][8];
    float* xr = x + row * dim;
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < NORM_OCTETS; ++i) {
        const int o = threadIdx.x + i * NORM_THREADS;
        if (o >= octets) continue;
        load8(xr + 8 * o, v[i]);
        if (add(v[i], o)) store8(xr + 8 * o, v[i]);
#pragma unroll
        for (int e = 0; e < 8; ++e) ss = fmaf(v[i][e], v[i][e], ss);
    }
    const float scale = rsqrtf(block_sum<NORM_THREADS>(ss) / dim + eps);
#pragma unroll
    for (int i = 0; i < NORM_OCTETS; ++i) {  // every lane goes round alike (store_octet)
        const int o = threadIdx.x + i * NORM_THREADS;
        if (i * NORM_THREADS >= octets) break;  // the same for the whole block
        const bool valid = o < octets;
        float r[8] = {};
        if (valid)
#pragma unroll
            for (int e = 0; e < 8; ++e) r[e] = v[i][e] * scale * wv[i][e];
        store_octet(out + row * dim + 8 * o, q8 ? q8 + row * (dim / 32) + o / 4 : nullptr, r, valid);
        if (q8k != nullptr && o - (threadIdx.x & 31) < octets)  // (r: the fp16 values now; the warp's octets alike)
            store_q8k(q8k + row * (dim / 256) + o / 32, r, threadIdx.x & 31);
    }
}

// The norm's weights, this thread's octets of them.
__device__ __forceinline__ void load_norm_weights(const float* __restrict__ w, int dim, float (&wv)[NORM_OCTETS][8]) {
#pragma unroll
    for (int i = 0; i < NORM_OCTETS; ++i) {
        const int o = threadIdx.x + i * NORM_THREADS;
        if (o < dim / 8) load8(w + 8 * o, wv[i]);
    }
}

// x: (n, dim) fp32 residual stream; x += delta when has_delta (delta: (n, dim) fp16).
// out: (n, dim) fp16 = x / sqrt(mean(x^2) + eps) * w, w: (dim,) fp32; q8 (n, dim / 32) Q8 units of
// out, unless null; q8k (n, dim / 256) its Q8K super-blocks, unless null. One block a row (norm_row).
extern "C" __global__ void __launch_bounds__(NORM_THREADS)
add_rms_norm(float* __restrict__ x, const __half* __restrict__ delta, int has_delta, const float* __restrict__ w,
             __half* __restrict__ out, Q8* __restrict__ q8, Q8K* __restrict__ q8k, int dim, float eps) {
    const size_t row = blockIdx.x;
    float wv[NORM_OCTETS][8];
    load_norm_weights(w, dim, wv);
    after_producer();
    norm_row(x, wv, out, q8, q8k, dim, eps, row, [&](float* v, int o) {
        if (has_delta) add_octet(v, delta + row * dim, o, false);
        return has_delta != 0;
    });
}

// The hybrid families' feed-forward summed into the residual stream and the next norm taken, in one kernel: x +=
// routed + shared * sigmoid(h . gate_w) (a mixture's routed experts plus its shared expert gated per row, each
// value rounded to fp16 as a separate sum would store it), then add_rms_norm's out and q8. routed, shared, h: (n,
// dim) fp16; gate_w (dim,) fp32; the gate's dot product by shared_gate (block_sum's tree). Prompt and decode rows
// alike take it, so a row's bits do not depend on its step (NumPy reference: HybridArrayOps.add_gated, then the
// norm).
extern "C" __global__ void __launch_bounds__(NORM_THREADS)
add_gated_rms_norm(float* __restrict__ x, const __half* __restrict__ routed, const __half* __restrict__ shared,
                   const __half* __restrict__ h, const float* __restrict__ gate_w, const float* __restrict__ w,
                   __half* __restrict__ out, Q8* __restrict__ q8, Q8K* __restrict__ q8k, int dim, float eps) {
    const size_t row = blockIdx.x;
    float wv[NORM_OCTETS][8];
    load_norm_weights(w, dim, wv);
    after_producer();
    const float gate = shared_gate<NORM_THREADS>(h + row * dim, gate_w, dim);
    norm_row(x, wv, out, q8, q8k, dim, eps, row, [&](float* v, int o) {
        float r[8], s[8];
        load_half8(routed + row * dim + 8 * o, r);
        load_half8(shared + row * dim + 8 * o, s);
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] += __half2float(__float2half(__fmaf_rn(s[e], gate, r[e])));
        return true;
    });
}

// The pair (a, b) rotated by the angle whose cosine and sine are c and s.
__device__ __forceinline__ void rotate(float& a, float& b, float c, float s) {
    const float ra = a * c - b * s, rb = b * c + a * s;
    a = ra;
    b = rb;
}

// The pair (j, j + half_d) of a head rotated by position p's angle j (cos, sin: (positions, d/2)).
__device__ __forceinline__ void rotate_pair(float& a, float& b, const float* __restrict__ cos,
                                            const float* __restrict__ sin, int p, int half_d, int j) {
    const size_t at = (size_t)p * half_d + j;
    rotate(a, b, cos[at], sin[at]);
}

// The pair written where its head goes: a Q head to q_dst (not null), a K or V head into its pool at
// row (store_kv: q8_0 needs the warp's 32 lanes to store one group of each half together).
__device__ __forceinline__ void store_pair(__half* q_dst, void* pool, __half* scales, size_t row, int half_d, int j,
                                           float a, float b) {
    if (q_dst != nullptr) {
        q_dst[j] = __float2half(a);
        q_dst[j + half_d] = __float2half(b);
    } else {
        store_kv(pool, scales, row + j, a);
        store_kv(pool, scales, row + j + half_d, b);
    }
}

// qkv: (n, heads + 2*kv_heads, d) fp16, the fused projection of n tokens: either one sequence's
// tokens at positions pos0[0] + t (seqs == 1), or a decode batch of n sequences, token t at pos0[t]
// its rows through its own block table (seqs == n); positions and tables are read from device memory
// so that a captured decode graph serves every position.
// Each head is laid out [evens, odds] so RoPE rotates its two halves. One thread per
// (token, head slot, pair j < d/2): q and k are rotated, q goes to q_out (n, heads, d), k and v
// go straight into this layer's pool k_cache/v_cache (paged.cuh) at the token's position, through its
// sequence's block table (table + table_off[seq]): fp16, or q8_0 with k_scales/v_scales (a warp holds
// one 32-value group of a row's first half and one of its second: store_q8_0).
// cos, sin: (positions, d/2) fp32 tables.
extern "C" __global__ void rope_store(const __half* __restrict__ qkv, __half* __restrict__ q_out,
                                      void* __restrict__ k_cache, void* __restrict__ v_cache,
                                      __half* __restrict__ k_scales, __half* __restrict__ v_scales,
                                      const float* __restrict__ cos, const float* __restrict__ sin,
                                      const int* __restrict__ pos0, const int* __restrict__ table,
                                      const int* __restrict__ table_off, int seqs, int n, int heads, int kv_heads,
                                      int d, int block_log2) {
    const int half_d = d / 2, slots = heads + 2 * kv_heads;
    const size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    const bool valid = idx < (size_t)n * slots * half_d;
    const int j = idx % half_d;
    const size_t r = idx / half_d;
    const int slot = r % slots, t = r / slots;
    const bool is_k = slot < heads + kv_heads;  // rotated (Q or K); a warp's lanes share one slot (half_d is 32 or 64)
    // the position, the block table and the rotation are no kernel's output (set before the step): they
    // are read while the QKV projection finishes, and only its output after the wait
    float c = 1.f, sn = 0.f;
    size_t row = 0;
    if (valid) {
        const int seq = seqs == 1 ? 0 : t, p = pos0[seq] + (seqs == 1 ? t : 0);
        if (is_k) c = cos[(size_t)p * half_d + j], sn = sin[(size_t)p * half_d + j];
        if (slot >= heads)
            row = kv_row(table + table_off[seq], p, slot - heads - (is_k ? 0 : kv_heads), kv_heads, block_log2, d);
    }
    after_producer();
    if (!valid) return;
    const __half* src = qkv + r * d;
    float a = __half2float(src[j]), b = __half2float(src[j + half_d]);
    if (is_k) rotate(a, b, c, sn);
    store_pair(slot < heads ? q_out + ((size_t)t * heads + slot) * d : nullptr, is_k ? k_cache : v_cache,
               is_k ? k_scales : v_scales, row, half_d, j, a, b);
}

// rope_store for Qwen3, whose Q and K heads are RMS-normalized first: each Q head and K head x
// (d values) becomes x / sqrt(mean(x^2) + eps) * w (w = q_w or k_w (d,) fp32, fp32 statistics,
// rounded to fp16 as a separate norm would store it), then is rotated and stored as rope_store
// does; V heads are stored as they are. One warp a (token, head slot): grid ceil(n * slots / 4),
// 128 threads.
extern "C" __global__ void norm_rope_store(const __half* __restrict__ qkv, __half* __restrict__ q_out,
                                           void* __restrict__ k_cache, void* __restrict__ v_cache,
                                           __half* __restrict__ k_scales, __half* __restrict__ v_scales,
                                           const float* __restrict__ cos, const float* __restrict__ sin,
                                           const int* __restrict__ pos0, const int* __restrict__ table,
                                           const int* __restrict__ table_off, int seqs, const float* __restrict__ q_w,
                                           const float* __restrict__ k_w, int n, int heads, int kv_heads, int d,
                                           int block_log2, float eps) {
    after_producer();
    const int half_d = d / 2, slots = heads + 2 * kv_heads, lane = threadIdx.x & 31;
    const size_t r = blockIdx.x * (size_t)4 + (threadIdx.x >> 5);
    if (r >= (size_t)n * slots) return;
    const int slot = r % slots, t = r / slots, seq = seqs == 1 ? 0 : t, p = pos0[seq] + (seqs == 1 ? t : 0);
    const int* tbl = table + table_off[seq];
    const __half* src = qkv + r * d;
    const bool rotate = slot < heads + kv_heads;
    const float* w = slot < heads ? q_w : k_w;
    float inv = 1.f;
    if (rotate) {
        float ss = 0.f;
        for (int i = lane; i < d; i += 32) {
            const float v = __half2float(src[i]);
            ss += v * v;
        }
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        inv = rsqrtf(ss / d + eps);
    }
    const bool is_k = slot < heads + kv_heads;
    __half* q_dst = slot < heads ? q_out + ((size_t)t * heads + slot) * d : nullptr;
    const size_t row = slot < heads ? 0 : kv_row(tbl, p, slot - heads - (is_k ? 0 : kv_heads), kv_heads, block_log2, d);
    for (int j = lane; j < half_d; j += 32) {  // every lane goes round alike (half_d is 32 or 64)
        float a = __half2float(src[j]), b = __half2float(src[j + half_d]);
        if (rotate) {
            a = __half2float(__float2half(a * inv * w[j]));
            b = __half2float(__float2half(b * inv * w[j + half_d]));
            rotate_pair(a, b, cos, sin, p, half_d, j);
        }
        store_pair(q_dst, is_k ? k_cache : v_cache, is_k ? k_scales : v_scales, row, half_d, j, a, b);
    }
}

// gate_up: (n, 2*ffn) fp16 = [gate | up] per row -> out: (n, ffn) fp16 = silu(gate) * up, and its
// Q8 units q8 (n, ffn / 32) unless null, its Q8K super-blocks q8k (n, ffn / 256) unless null (ffn a multiple of
// 256: a warp's 32 octets one super-block of a row). One thread eight outputs (four threads a unit); octets =
// n * ffn / 8, a whole number of warps' worth not required (the tail's lanes store nothing).
extern "C" __global__ void silu_mul(const __half* __restrict__ gate_up, __half* __restrict__ out, Q8* __restrict__ q8,
                                    Q8K* __restrict__ q8k, int ffn, long long octets) {
    after_producer();
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    const bool valid = i < octets;
    const long long row = i / (ffn / 8), o = i % (ffn / 8);
    float v[8] = {};
    if (valid) {
        const uint4 gr = reinterpret_cast<const uint4*>(gate_up + row * 2 * ffn)[o];
        const uint4 ur = reinterpret_cast<const uint4*>(gate_up + row * 2 * ffn + ffn)[o];
        const __half2* gh = reinterpret_cast<const __half2*>(&gr);
        const __half2* uh = reinterpret_cast<const __half2*>(&ur);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float2 a = __half22float2(gh[e]), b = __half22float2(uh[e]);
            v[2 * e] = silu_times(a.x, b.x);
            v[2 * e + 1] = silu_times(a.y, b.y);
        }
    }
    store_octet(out + row * ffn + 8 * o, q8 ? q8 + i / 4 : nullptr, v, valid);
    if (q8k != nullptr && i - (threadIdx.x & 31) < octets) store_q8k(q8k + i / 32, v, threadIdx.x & 31);
}
