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
// Every kernel here is thread-independent (no shared memory, no shuffles, no barriers).
//
// Recurrent states: each sequence's are float32 arrays of their own (engine/kvcache/recurrent.py), reached
// through per-sequence addresses (`now`, `mark`: (seqs,) 64-bit), the layer's part at `layer_offset` floats in.
// Rows of sequence s: [row_lo[s], row_lo[s + 1]) of the step; mark_after[s] > 0: after that many of its rows
// (the read's last chunk boundary) the state is copied into its mark as well.
#include <cuda_fp16.h>

#include "pdl.cuh"
#include "q8.cuh"

constexpr int LA_THREADS = 128;  // threads a block of the row-wise kernels
constexpr int SCAN_THREADS = 32;  // delta_scan: one warp a (sequence, value head, 32 columns)

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

// proj[:, 0:channels] (fp16, rows proj_stride apart) -> out (n, channels) fp32 = silu(causal depthwise conv)
// with weight (channels, K) fp32; the window now[s] + layer_offset (K-1, channels) fp32 holds the inputs before
// the sequence's first row and is left holding its last K-1. Thread = (sequence, channel): grid
// (ceil(channels / 128), seqs), 128 threads. The products are summed as the reference sums them (oldest first).
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
#pragma unroll
    for (int i = 0; i < K; i++) w[i] = weight[(size_t)c * K + i];
#pragma unroll
    for (int i = 0; i < K - 1; i++) past[i] = window[(size_t)i * channels + c];
    const int lo = row_lo[s], hi = row_lo[s + 1], save = mark_after[s];
    for (int r = lo; r < hi; r++) {
        const float x = __half2float(proj[(size_t)r * proj_stride + c]);
        float acc = past[0] * w[0];
#pragma unroll
        for (int i = 1; i < K - 1; i++) acc += past[i] * w[i];
        acc += x * w[K - 1];
#pragma unroll
        for (int i = 0; i < K - 2; i++) past[i] = past[i + 1];
        past[K - 2] = x;
        out[(size_t)r * channels + c] = acc / (1.f + expf(-acc));
        if (r - lo + 1 == save) {
            float* m = state_at(mark, s, layer_offset);
#pragma unroll
            for (int i = 0; i < K - 1; i++) m[(size_t)i * channels + c] = past[i];
        }
    }
#pragma unroll
    for (int i = 0; i < K - 1; i++) window[(size_t)i * channels + c] = past[i];
}

extern "C" __global__ void __launch_bounds__(LA_THREADS)
conv_scan_k4(const __half* __restrict__ proj, int proj_stride, float* __restrict__ out,
             const float* __restrict__ weight, const unsigned long long* __restrict__ now,
             const unsigned long long* __restrict__ mark, const int* __restrict__ row_lo,
             const int* __restrict__ mark_after, int channels, long long layer_offset) {
    conv_scan<4>(proj, proj_stride, out, weight, now, mark, row_lo, mark_after, channels, layer_offset);
}

// x: n rows `stride` floats apart, heads [0, heads) of d values each from column 0, L2-normalized in place:
// v / sqrt(sum(v^2) + eps), then times `scale` for heads below `scaled` (q's 1/sqrt(dk)). Thread = (row, head).
extern "C" __global__ void __launch_bounds__(LA_THREADS)
l2_heads(float* __restrict__ x, int stride, int n, int heads, int d, int scaled, float scale, float eps) {
    after_producer();
    const long long i = blockIdx.x * (long long)LA_THREADS + threadIdx.x;
    if (i >= (long long)n * heads) return;
    const int head = i % heads;
    float* v = x + (i / heads) * stride + (size_t)head * d;
    float ss = 0.f;
    for (int k = 0; k < d; k++) ss += v[k] * v[k];
    const float norm = sqrtf(ss + eps), f = head < scaled ? scale : 1.f;
    for (int k = 0; k < d; k++) v[k] = v[k] / norm * f;
}

// The gated delta rule (engine/ops/delta_rule.py's `step`) over each sequence's rows, one position at a time.
// conv (n, channels) fp32 = [q (kh*DK) | k (kh*DK) | v (nv*dv)], q and k normalized (l2_heads); proj's columns
// b_col.. and a_col.. (nv each, fp16) give beta = sigmoid(b) and g = A * softplus(a + dt_bias) (A, dt_bias (nv,)
// fp32). Value head h reads k head (tiled ? h % kh : h / (nv / kh)). The state now[s] + layer_offset: (nv, DK,
// dv) fp32; out (n, nv, dv) fp32. Per position: S *= exp(g); delta = (v - S^T k) * beta; S += k delta^T;
// o = S^T q. Thread = (sequence, head, column c): its column of S in registers. Grid (ceil(DV / 32), nv, seqs),
// 32 threads. Built for dk = dv = DK (delta_scan_k<DK>): the column's addresses are then constant offsets.
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
#pragma unroll
    for (int i = 0; i < DK; i++) col[i] = state[(size_t)i * DV];
    const float a_h = A[h], bias = dt_bias[h];
    const int lo = row_lo[s], hi = row_lo[s + 1], save = mark_after[s];
    for (int r = lo; r < hi; r++) {
        const float* q = conv + (size_t)r * channels + kv * DK;
        const float* k = q + kh * DK;
        const float v = conv[(size_t)r * channels + 2 * kh * DK + h * DV + c];
        const float beta = sigmoid_f(__half2float(proj[(size_t)r * proj_stride + b_col + h]));
        const float a = __half2float(proj[(size_t)r * proj_stride + a_col + h]) + bias;
        const float decay = expf(a_h * (a > 20.f ? a : log1pf(expf(a))));
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
        out[((size_t)r * nv + h) * DV + c] = o;
        if (r - lo + 1 == save) {
            float* m = state_at(mark, s, at);
#pragma unroll
            for (int i = 0; i < DK; i++) m[(size_t)i * DV] = col[i];
        }
    }
#pragma unroll
    for (int i = 0; i < DK; i++) state[(size_t)i * DV] = col[i];
}

#define DELTA_SCAN(DK)                                                                                              \
    extern "C" __global__ void __launch_bounds__(SCAN_THREADS)                                                      \
    delta_scan_k##DK(const float* __restrict__ conv, const __half* __restrict__ proj, int proj_stride, int b_col,     \
                     int a_col, const float* __restrict__ A, const float* __restrict__ dt_bias,                    \
                     float* __restrict__ out,                                                                       \
                     const unsigned long long* __restrict__ now, const unsigned long long* __restrict__ mark,       \
                     const int* __restrict__ row_lo, const int* __restrict__ mark_after, int nv, int kh, int tiled,  \
                     int channels, long long layer_offset) {                                                        \
        delta_scan<DK, DK>(conv, proj, proj_stride, b_col, a_col, A, dt_bias, out, now, mark, row_lo, mark_after, nv, \
                           kh, tiled, channels, layer_offset);                                                      \
    }
DELTA_SCAN(32)
DELTA_SCAN(64)
DELTA_SCAN(128)

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

// The gated norm: out (n, nv*dv) fp16 = o / sqrt(mean(o^2) + eps) * w * silu(z) per (row, value head); o (n, nv,
// dv) fp32, z = proj's columns z_col.. (nv*dv, fp16), w (dv,) fp32; q8: out's Q8 units (n * nv * dv / 32), or
// null. Thread = (row, head), its values a unit of 32 at a time (dv % 32 == 0).
extern "C" __global__ void __launch_bounds__(LA_THREADS)
gated_norm(const float* __restrict__ o, const __half* __restrict__ proj, int proj_stride, int z_col,
           const float* __restrict__ w, __half* __restrict__ out, Q8* __restrict__ q8, int n, int nv, int dv,
           float eps) {
    after_producer();
    const long long i = blockIdx.x * (long long)LA_THREADS + threadIdx.x;
    if (i >= (long long)n * nv) return;
    const long long r = i / nv;
    const float* x = o + i * dv;
    const __half* z = proj + r * proj_stride + z_col + (i % nv) * dv;
    float ss = 0.f;
    for (int k = 0; k < dv; k++) ss += x[k] * x[k];
    const float norm = sqrtf(ss / dv + eps);
    for (int u = 0; u < dv / 32; u++) {
        float v[32];
#pragma unroll
        for (int j = 0; j < 32; j++) {
            const int k = 32 * u + j;
            const float g = __half2float(z[k]);
            v[j] = x[k] / norm * w[k] * (g * sigmoid_f(g));
        }
        store_unit(out + i * dv + 32 * u, q8 ? q8 + i * (dv / 32) + u : nullptr, v);
    }
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
