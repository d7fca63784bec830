// The hybrid families' own layers on the GPU (Qwen3-Next, Qwen3.5: engine/model/hybrid.py): a Gated DeltaNet
// layer's causal convolution, q/k L2 norms, gated delta rule and gated norm; the gated attention's sigmoid gate;
// the shared expert's gated sum. NumPy references: engine/ops/gated_delta_net.py, engine/ops/hybrid_ops.py.
//
// Exactness: the convolution and the delta rule go through each sequence's rows in order, one position at a
// time, each piece of state (a channel's window, a column of a value head's delta-rule matrix) held by one
// thread from the sequence's first row to its last. A position's result is therefore the same bits whether it
// is read in a prompt step (cut anywhere) or decoded, and whatever else the step holds. (The CPU reads in the
// chunked form, whose last bits differ from the recurrent one's: engine/ops/delta_rule.py.)
//
// A decode step (one row a sequence) takes the mixer in two kernels, conv_l2 and delta_norm; a prompt step in four,
// conv_scan, l2_heads, delta_scan and gated_norm. Both run the same device functions on the same values: a row's
// convolution (conv_step), one position of the delta rule (delta_step), and the norms over a head's values, one a
// thread, summed by block_sum's tree (l2_value, gated_value), so a decoded position has the bits it has read.
//
// Recurrent states: each sequence's are float32 arrays of their own (engine/kvcache/recurrent.py), reached
// through per-sequence addresses (`now`, `mark`: (seqs,) 64-bit), the layer's part at `layer_offset` floats in.
// Rows of sequence s: [row_lo[s], row_lo[s + 1]) of the step; mark_after[s] > 0: after that many of its rows
// (the read's last chunk boundary) the state is copied into its mark as well.
#include <cuda_fp16.h>

#include "block_sum.cuh"
#include "pdl.cuh"
#include "q8.cuh"

constexpr int LA_THREADS = 128;  // threads a block of the row-wise kernels
constexpr int SCAN_THREADS = 32;  // delta_scan: one warp a (sequence, value head, 32 columns)
// (the head-wide kernels, *_d<D> and *_k<D>: D threads a block, one a value of a head of D, D in 32, 64, 128)

__device__ __forceinline__ float* state_at(const unsigned long long* addresses, int s, long long offset) {
    return reinterpret_cast<float*>(addresses[s]) + offset;
}

__device__ __forceinline__ float sigmoid_f(float x) { return 1.f / (1.f + expf(-x)); }

// A load the compiler may not merge with an earlier one of the same address: delta_scan reads k twice, and
// keeping the first reads in registers for the second pass (DK of them beside a DK-value column) spilled.
__device__ __forceinline__ float load_again(const float* p) {
#ifdef __CUDA_ARCH__
    float v;
    asm volatile("ld.global.ca.f32 %0, [%1];" : "=f"(v) : "l"(p));
    return v;
#else
    return *p;
#endif
}

// One row of the causal depthwise convolution for a thread's channel: silu(past . w[0:K-1] + x w[K-1]), the oldest
// input first (as the reference sums them); past (the K-1 inputs before x) moves on by one.
template <int K>
__device__ __forceinline__ float conv_step(float (&past)[K - 1], const float (&w)[K], float x) {
    float acc = past[0] * w[0];
#pragma unroll
    for (int i = 1; i < K - 1; i++) acc += past[i] * w[i];
    acc += x * w[K - 1];
#pragma unroll
    for (int i = 0; i < K - 2; i++) past[i] = past[i + 1];
    past[K - 2] = x;
    return acc / (1.f + expf(-acc));
}

// A channel's weights and its window (now[s] + layer_offset: (K-1, channels) fp32, the inputs before the
// sequence's next row).
template <int K>
__device__ __forceinline__ void conv_load(const float* __restrict__ weight, const float* window, int c, int channels,
                                          float (&w)[K], float (&past)[K - 1]) {
#pragma unroll
    for (int i = 0; i < K; i++) w[i] = weight[(size_t)c * K + i];
#pragma unroll
    for (int i = 0; i < K - 1; i++) past[i] = window[(size_t)i * channels + c];
}

template <int K>
__device__ __forceinline__ void conv_store(float* window, int c, int channels, const float (&past)[K - 1]) {
#pragma unroll
    for (int i = 0; i < K - 1; i++) window[(size_t)i * channels + c] = past[i];
}

// proj[:, 0:channels] (fp16, rows proj_stride apart) -> out (n, channels) fp32 = silu(causal depthwise conv)
// with weight (channels, K) fp32; the window now[s] + layer_offset (K-1, channels) fp32 holds the inputs before
// the sequence's first row and is left holding its last K-1. Thread = (sequence, channel): grid
// (ceil(channels / 128), seqs), 128 threads.
template <int K>
__device__ __forceinline__ void conv_scan(const __half* __restrict__ proj, int proj_stride, float* __restrict__ out,
                                          const float* __restrict__ weight, const unsigned long long* __restrict__ now,
                                          const unsigned long long* __restrict__ mark, const int* __restrict__ row_lo,
                                          const int* __restrict__ mark_after, int channels, long long layer_offset) {
    after_producer();
    const int c = blockIdx.x * LA_THREADS + threadIdx.x, s = blockIdx.y;
    if (c >= channels) return;
    float* window = state_at(now, s, layer_offset);
    float w[K], past[K - 1];
    conv_load<K>(weight, window, c, channels, w, past);
    const int lo = row_lo[s], hi = row_lo[s + 1], save = mark_after[s];
    for (int r = lo; r < hi; r++) {
        out[(size_t)r * channels + c] = conv_step<K>(past, w, __half2float(proj[(size_t)r * proj_stride + c]));
        if (r - lo + 1 == save) conv_store<K>(state_at(mark, s, layer_offset), c, channels, past);
    }
    conv_store<K>(window, c, channels, past);
}

extern "C" __global__ void __launch_bounds__(LA_THREADS)
conv_scan_k4(const __half* __restrict__ proj, int proj_stride, float* __restrict__ out,
             const float* __restrict__ weight, const unsigned long long* __restrict__ now,
             const unsigned long long* __restrict__ mark, const int* __restrict__ row_lo,
             const int* __restrict__ mark_after, int channels, long long layer_offset) {
    conv_scan<4>(proj, proj_stride, out, weight, now, mark, row_lo, mark_after, channels, layer_offset);
}

// A head's value v (one a thread of the block's D) L2-normalized: v / sqrt(sum(v^2) + eps) * f.
template <int D>
__device__ __forceinline__ float l2_value(float v, float eps, float f) {
    return v / sqrtf(block_sum<D>(v * v) + eps) * f;
}

// x: n rows `stride` floats apart, heads [0, heads) of D values each from column 0, L2-normalized in place (times
// `scale` for heads below `scaled`: q's 1/sqrt(dk)). Block = (row, head): grid n * heads, D threads.
template <int D>
__device__ __forceinline__ void l2_heads(float* __restrict__ x, int stride, int heads, int scaled, float scale,
                                         float eps) {
    after_producer();
    const int head = blockIdx.x % heads;
    float* v = x + (size_t)(blockIdx.x / heads) * stride + (size_t)head * D + threadIdx.x;
    *v = l2_value<D>(*v, eps, head < scaled ? scale : 1.f);
}

// A decode step's convolution and q/k norms in one kernel, for sequences of one row each: conv_scan's row, then
// l2_heads' norm for the q and k heads (the first 2 kh heads of D channels; v's channels as they are). Block =
// (sequence, head of D channels): grid (channels / D, seqs), D threads.
template <int K, int D>
__device__ __forceinline__ void conv_l2(const __half* __restrict__ proj, int proj_stride, float* __restrict__ out,
                                        const float* __restrict__ weight, const unsigned long long* __restrict__ now,
                                        const unsigned long long* __restrict__ mark, const int* __restrict__ row_lo,
                                        const int* __restrict__ mark_after, int channels, long long layer_offset,
                                        int kh, float scale, float eps) {
    const int head = blockIdx.x, c = head * D + threadIdx.x, s = blockIdx.y;
    float* window = state_at(now, s, layer_offset);
    float w[K], past[K - 1];
    after_producer();
    conv_load<K>(weight, window, c, channels, w, past);
    const int r = row_lo[s];
    float v = conv_step<K>(past, w, __half2float(proj[(size_t)r * proj_stride + c]));
    if (mark_after[s] == 1) conv_store<K>(state_at(mark, s, layer_offset), c, channels, past);
    conv_store<K>(window, c, channels, past);
    if (head < 2 * kh) v = l2_value<D>(v, eps, head < kh ? scale : 1.f);  // (the same for the whole block)
    out[(size_t)r * channels + c] = v;
}

// The gates of value head h at row r: beta = sigmoid(b), decay = exp(A * softplus(a + dt_bias)) from proj's
// columns b_col + h and a_col + h.
__device__ __forceinline__ void head_gates(const __half* __restrict__ proj, size_t r, int proj_stride, int b_col,
                                           int a_col, int h, float a_h, float bias, float& beta, float& decay) {
    beta = sigmoid_f(__half2float(proj[r * proj_stride + b_col + h]));
    const float a = __half2float(proj[r * proj_stride + a_col + h]) + bias;
    decay = expf(a_h * (a > 20.f ? a : log1pf(expf(a))));
}

// One position of the gated delta rule for a thread's column of S (DK values): S *= decay; delta = (v - S^T k) *
// beta; S += k delta^T; returns S^T q (the column's output).
template <int DK>
__device__ __forceinline__ float delta_step(float (&col)[DK], const float* q, const float* k, float v, float beta,
                                            float decay) {
    float remembered = 0.f;
#pragma unroll
    for (int i = 0; i < DK; i++) {
        col[i] *= decay;
        remembered += col[i] * k[i];
    }
    const float delta = (v - remembered) * beta;
    float o = 0.f;
#pragma unroll
    for (int i = 0; i < DK; i++) {
        col[i] += load_again(k + i) * delta;
        o += col[i] * q[i];
    }
    return o;
}

template <int DK>
__device__ __forceinline__ void column_load(const float* p, float (&col)[DK], int dv) {
#pragma unroll
    for (int i = 0; i < DK; i++) col[i] = p[(size_t)i * dv];
}

template <int DK>
__device__ __forceinline__ void column_store(float* p, const float (&col)[DK], int dv) {
#pragma unroll
    for (int i = 0; i < DK; i++) p[(size_t)i * dv] = col[i];
}

// The gated delta rule (engine/ops/delta_rule.py's `step`) over each sequence's rows, one position at a time.
// conv (n, channels) fp32 = [q (kh*DK) | k (kh*DK) | v (nv*dv)], q and k normalized (l2_heads); proj's columns
// b_col.. and a_col.. (nv each, fp16) give beta = sigmoid(b) and g = A * softplus(a + dt_bias) (A, dt_bias (nv,)
// fp32). Value head h reads k head (tiled ? h % kh : h / (nv / kh)). The state now[s] + layer_offset: (nv, DK,
// dv) fp32; out (n, nv, dv) fp32. Thread = (sequence, head, column c): its column of S in registers. Grid
// (ceil(DV / 32), nv, seqs), 32 threads. Built for dk = dv = DK (delta_scan_k<DK>): the column's addresses are
// then constant offsets.
template <int DK, int DV>
__device__ __forceinline__ void delta_scan(const float* __restrict__ conv, const __half* __restrict__ proj,
                                           int proj_stride, int b_col, int a_col, const float* __restrict__ A,
                                           const float* __restrict__ dt_bias, float* __restrict__ out,
                                           const unsigned long long* __restrict__ now,
                                           const unsigned long long* __restrict__ mark, const int* __restrict__ row_lo,
                                           const int* __restrict__ mark_after, int nv, int kh, int tiled,
                                           int channels, long long layer_offset) {
    after_producer();
    const int c = blockIdx.x * SCAN_THREADS + threadIdx.x, h = blockIdx.y, s = blockIdx.z;
    if (c >= DV) return;
    const int kv = tiled ? h % kh : h / (nv / kh);
    const long long at = layer_offset + (long long)h * DK * DV + c;  // S[h][0][c]; S[h][i][c] is i * DV further
    float* state = state_at(now, s, at);
    float col[DK];
    column_load<DK>(state, col, DV);
    const float a_h = A[h], bias = dt_bias[h];
    const int lo = row_lo[s], hi = row_lo[s + 1], save = mark_after[s];
    for (int r = lo; r < hi; r++) {
        const float* q = conv + (size_t)r * channels + kv * DK;
        float beta, decay;
        head_gates(proj, r, proj_stride, b_col, a_col, h, a_h, bias, beta, decay);
        out[((size_t)r * nv + h) * DV + c] =
            delta_step<DK>(col, q, q + kh * DK, conv[(size_t)r * channels + 2 * kh * DK + h * DV + c], beta, decay);
        if (r - lo + 1 == save) column_store<DK>(state_at(mark, s, at), col, DV);
    }
    column_store<DK>(state, col, DV);
}

// The gated norm of a head's value o (one a thread of the block's D): o / sqrt(mean(o^2) + eps) * w * silu(z).
template <int D>
__device__ __forceinline__ float gated_value(float o, float w, float z, float eps) {
    return o / sqrtf(block_sum<D>(o * o) / D + eps) * w * (z * sigmoid_f(z));
}

// The gated norm: out (n, nv*D) fp16 = gated_value per (row, value head); o (n, nv, D) fp32, z = proj's columns
// z_col.. (nv*D, fp16), w (D,) fp32; q8: out's Q8 units, or null. Block = (row, head): grid n * nv, D threads.
template <int D>
__device__ __forceinline__ void gated_norm(const float* __restrict__ o, const __half* __restrict__ proj,
                                           int proj_stride, int z_col, const float* __restrict__ w,
                                           __half* __restrict__ out, Q8* __restrict__ q8, int nv, float eps) {
    after_producer();
    const size_t i = blockIdx.x, r = i / nv, c = threadIdx.x;
    const float z = __half2float(proj[r * proj_stride + z_col + (i % nv) * D + c]);
    const float v = gated_value<D>(o[i * D + c], w[c], z, eps);
    store_lane(out + i * D + c, q8 ? q8 + i * (D / 32) + c / 32 : nullptr, v);
}

// A decode step's delta rule and gated norm in one kernel, for sequences of one row each: delta_scan's position,
// then gated_norm's value. Block = (sequence, value head): grid (nv, seqs), D threads, a column each.
template <int D>
__device__ __forceinline__ void delta_norm(const float* __restrict__ conv, const __half* __restrict__ proj,
                                           int proj_stride, int z_col, int b_col, int a_col,
                                           const float* __restrict__ A, const float* __restrict__ dt_bias,
                                           const float* __restrict__ w, __half* __restrict__ out, Q8* __restrict__ q8,
                                           const unsigned long long* __restrict__ now,
                                           const unsigned long long* __restrict__ mark, const int* __restrict__ row_lo,
                                           const int* __restrict__ mark_after, int nv, int kh, int tiled,
                                           int channels, long long layer_offset, float eps) {
    const int c = threadIdx.x, h = blockIdx.x, s = blockIdx.y;
    const int kv = tiled ? h % kh : h / (nv / kh);
    const long long at = layer_offset + (long long)h * D * D + c;
    float* state = state_at(now, s, at);
    const float a_h = A[h], bias = dt_bias[h], wc = w[c];
    after_producer();
    float col[D];
    column_load<D>(state, col, D);
    const int r = row_lo[s];
    const float* q = conv + (size_t)r * channels + kv * D;
    float beta, decay;
    head_gates(proj, r, proj_stride, b_col, a_col, h, a_h, bias, beta, decay);
    const float o = delta_step<D>(col, q, q + kh * D, conv[(size_t)r * channels + 2 * kh * D + h * D + c], beta, decay);
    if (mark_after[s] == 1) column_store<D>(state_at(mark, s, at), col, D);
    column_store<D>(state, col, D);
    const float z = __half2float(proj[(size_t)r * proj_stride + z_col + h * D + c]);
    const size_t i = (size_t)r * nv + h;
    store_lane(out + i * D + c, q8 ? q8 + i * (D / 32) + c / 32 : nullptr, gated_value<D>(o, wc, z, eps));
}

#define HEAD_KERNELS(D)                                                                                             \
    extern "C" __global__ void __launch_bounds__(SCAN_THREADS)                                                      \
    delta_scan_k##D(const float* __restrict__ conv, const __half* __restrict__ proj, int proj_stride, int b_col,      \
                    int a_col, const float* __restrict__ A, const float* __restrict__ dt_bias,                     \
                    float* __restrict__ out, const unsigned long long* __restrict__ now,                           \
                    const unsigned long long* __restrict__ mark, const int* __restrict__ row_lo,                   \
                    const int* __restrict__ mark_after, int nv, int kh, int tiled, int channels,                   \
                    long long layer_offset) {                                                                       \
        delta_scan<D, D>(conv, proj, proj_stride, b_col, a_col, A, dt_bias, out, now, mark, row_lo, mark_after, nv,  \
                         kh, tiled, channels, layer_offset);                                                        \
    }                                                                                                               \
    extern "C" __global__ void __launch_bounds__(D)                                                                 \
    l2_heads_d##D(float* __restrict__ x, int stride, int heads, int scaled, float scale, float eps) {               \
        l2_heads<D>(x, stride, heads, scaled, scale, eps);                                                          \
    }                                                                                                               \
    extern "C" __global__ void __launch_bounds__(D)                                                                 \
    gated_norm_d##D(const float* __restrict__ o, const __half* __restrict__ proj, int proj_stride, int z_col,       \
                    const float* __restrict__ w, __half* __restrict__ out, Q8* __restrict__ q8, int nv, float eps) { \
        gated_norm<D>(o, proj, proj_stride, z_col, w, out, q8, nv, eps);                                            \
    }                                                                                                               \
    extern "C" __global__ void __launch_bounds__(D)                                                                 \
    conv_l2_k4_d##D(const __half* __restrict__ proj, int proj_stride, float* __restrict__ out,                      \
                    const float* __restrict__ weight, const unsigned long long* __restrict__ now,                  \
                    const unsigned long long* __restrict__ mark, const int* __restrict__ row_lo,                   \
                    const int* __restrict__ mark_after, int channels, long long layer_offset, int kh, float scale, \
                    float eps) {                                                                                    \
        conv_l2<4, D>(proj, proj_stride, out, weight, now, mark, row_lo, mark_after, channels, layer_offset, kh,    \
                      scale, eps);                                                                                  \
    }                                                                                                               \
    extern "C" __global__ void __launch_bounds__(D)                                                                 \
    delta_norm_k##D(const float* __restrict__ conv, const __half* __restrict__ proj, int proj_stride, int z_col,     \
                    int b_col, int a_col, const float* __restrict__ A, const float* __restrict__ dt_bias,          \
                    const float* __restrict__ w, __half* __restrict__ out, Q8* __restrict__ q8,                    \
                    const unsigned long long* __restrict__ now, const unsigned long long* __restrict__ mark,       \
                    const int* __restrict__ row_lo, const int* __restrict__ mark_after, int nv, int kh, int tiled,  \
                    int channels, long long layer_offset, float eps) {                                              \
        delta_norm<D>(conv, proj, proj_stride, z_col, b_col, a_col, A, dt_bias, w, out, q8, now, mark, row_lo,       \
                      mark_after, nv, kh, tiled, channels, layer_offset, eps);                                      \
    }
HEAD_KERNELS(32)
HEAD_KERNELS(64)
HEAD_KERNELS(128)

// 32 values rounded to fp16 and stored at out, and, when q8 is given, the Q8 unit of what the fp16 row holds
// (a decode row's 8-bit form, which the out-projection's matvec reads: q8.cuh).
__device__ __forceinline__ void store_unit(__half* __restrict__ out, Q8* __restrict__ q8, float* v) {
#pragma unroll
    for (int j = 0; j < 32; ++j) {
        const __half h = __float2half(v[j]);
        out[j] = h;
        v[j] = __half2float(h);
    }
    if (q8 != nullptr) quantize_unit(v, q8);
}

// out = x * sigmoid(gate), (units * 32,) fp16 each: the gated attention's output gate; q8: out's Q8 units, or
// null. Thread = one unit of 32 values.
extern "C" __global__ void __launch_bounds__(LA_THREADS)
sigmoid_mul(const __half* __restrict__ x, const __half* __restrict__ gate, __half* __restrict__ out,
            Q8* __restrict__ q8, long long units) {
    after_producer();
    const long long u = blockIdx.x * (long long)LA_THREADS + threadIdx.x;
    if (u >= units) return;
    float v[32];
#pragma unroll
    for (int j = 0; j < 32; j++) v[j] = __half2float(x[32 * u + j]) * sigmoid_f(__half2float(gate[32 * u + j]));
    store_unit(out + 32 * u, q8 ? q8 + u : nullptr, v);
}
