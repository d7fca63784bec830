// The hybrid families' own layers on the GPU (Qwen3-Next, Qwen3.5: engine/model/hybrid.py): a Gated DeltaNet
// layer's causal convolution, q/k L2 norms, gated delta rule and gated norm; the gated attention's sigmoid gate;
// the shared expert's gated sum. NumPy references: engine/ops/gated_delta_net.py, engine/ops/delta_rule.py.
//
// Exactness, as on the CPU (engine/ops/delta_rule.py): a prompt's positions go through the delta rule in the
// chunked form, chunks of CHUNK positions at absolute multiples of CHUNK (a read starts at its mark, such a
// boundary), the last one as if padded with zeros; decode rows take the recurrent form from the state `now`.
// A position's output and state are then the same bits whatever the read's length or company, and a read cut
// short of a boundary is read again from its mark (engine/kvcache/recurrent.py). Every sum has a fixed order
// set by the chunk alone; a block reads its own sequence's rows only.
//
// A decode step (one row a sequence) takes the mixer in two kernels, conv_l2 and delta_norm; a prompt step in
// six: conv_rows (every row's convolution at once: a row's inputs are the rows before it, or the window),
// conv_window (the windows moved on), l2_heads, delta_prep (each chunk's WY form: its triangular solve and the
// products that need no state, all chunks and heads at once), delta_chunks (the chunks of each sequence in order
// against its state: the only serial part) and gated_norm. The convolution and the norms are the same device
// functions in both (conv_step; l2_value and gated_value: one value a thread, summed by block_sum's tree).
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
constexpr int CHUNK = 64;  // positions of one chunk of the chunked form (engine/ops/delta_rule.py's CHUNK)
constexpr int CHUNK_THREADS = 256;  // delta_prep's and delta_chunks' blocks: 8 warps
constexpr int TILE = 32;  // columns a tile of delta_prep's staged rows, and of the state a delta_chunks block holds
// (the head-wide kernels, *_d<D> and *_k<D>: D threads a block, one a value of a head of D, D in 32, 64, 128)

__device__ __forceinline__ float* state_at(const unsigned long long* addresses, int s, long long offset) {
    return reinterpret_cast<float*>(addresses[s]) + offset;
}

__device__ __forceinline__ float sigmoid_f(float x) { return 1.f / (1.f + expf(-x)); }

// A load the compiler may not merge with an earlier one of the same address: delta_step reads k twice, and
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

// The sequence of a step's row r: the s with row_lo[s] <= r < row_lo[s + 1] (a step holds a few sequences).
__device__ __forceinline__ int sequence_of(const int* __restrict__ row_lo, int r) {
    int s = 0;
    while (row_lo[s + 1] <= r) s++;
    return s;
}

// Input p of channel c of a sequence whose rows start at step row lo: proj's row p, or before lo the window
// (K-1, channels) fp32 of the inputs before the sequence's first row.
template <int K>
__device__ __forceinline__ float conv_input(const __half* __restrict__ proj, int proj_stride, const float* window,
                                            int lo, int p, int c, int channels) {
    return p >= lo ? __half2float(proj[(size_t)p * proj_stride + c]) : window[(size_t)(p - lo + K - 1) * channels + c];
}

// proj[:, 0:channels] (fp16, rows proj_stride apart) -> out (n, channels) fp32 = silu(causal depthwise conv)
// with weight (channels, K) fp32, every row at once: a row's window is the K-1 rows before it, or the inputs
// before its sequence's first row (now[s] + layer_offset: (K-1, channels) fp32), summed as conv_step sums a
// decode row's. conv_window moves the windows on afterwards. Thread = (row, channel): grid (n, ceil(channels /
// 128)), 128 threads.
template <int K>
__device__ __forceinline__ void conv_rows(const __half* __restrict__ proj, int proj_stride, float* __restrict__ out,
                                          const float* __restrict__ weight, const unsigned long long* __restrict__ now,
                                          const int* __restrict__ row_lo, int channels, long long layer_offset) {
    after_producer();
    const int c = blockIdx.y * LA_THREADS + threadIdx.x, r = blockIdx.x;
    if (c >= channels) return;
    const int s = sequence_of(row_lo, r), lo = row_lo[s];
    const float* window = state_at(now, s, layer_offset);
    float w[K], past[K - 1];
#pragma unroll
    for (int i = 0; i < K; i++) w[i] = weight[(size_t)c * K + i];
#pragma unroll
    for (int i = 0; i < K - 1; i++)
        past[i] = conv_input<K>(proj, proj_stride, window, lo, r - (K - 1) + i, c, channels);
    out[(size_t)r * channels + c] = conv_step<K>(past, w, __half2float(proj[(size_t)r * proj_stride + c]));
}

// After conv_rows: each sequence's window (now[s]) holds the inputs before its read's last row and after it, and
// its mark's (mark[s]) those before row mark_after[s] where that is > 0. Thread = (sequence, channel): grid
// (ceil(channels / 128), seqs), 128 threads.
template <int K>
__device__ __forceinline__ void conv_window(const __half* __restrict__ proj, int proj_stride,
                                            const unsigned long long* __restrict__ now,
                                            const unsigned long long* __restrict__ mark,
                                            const int* __restrict__ row_lo, const int* __restrict__ mark_after,
                                            int channels, long long layer_offset) {
    after_producer();
    const int c = blockIdx.x * LA_THREADS + threadIdx.x, s = blockIdx.y;
    if (c >= channels) return;
    float* window = state_at(now, s, layer_offset);
    const int lo = row_lo[s], hi = row_lo[s + 1], save = mark_after[s];
    float kept[K - 1], last[K - 1];
#pragma unroll
    for (int i = 0; i < K - 1; i++) {
        kept[i] = conv_input<K>(proj, proj_stride, window, lo, lo + save - (K - 1) + i, c, channels);
        last[i] = conv_input<K>(proj, proj_stride, window, lo, hi - (K - 1) + i, c, channels);
    }
    if (save > 0) conv_store<K>(state_at(mark, s, layer_offset), c, channels, kept);
    conv_store<K>(window, c, channels, last);
}

extern "C" __global__ void __launch_bounds__(LA_THREADS)
conv_rows_k4(const __half* __restrict__ proj, int proj_stride, float* __restrict__ out,
             const float* __restrict__ weight, const unsigned long long* __restrict__ now,
             const int* __restrict__ row_lo, int channels, long long layer_offset) {
    conv_rows<4>(proj, proj_stride, out, weight, now, row_lo, channels, layer_offset);
}

extern "C" __global__ void __launch_bounds__(LA_THREADS)
conv_window_k4(const __half* __restrict__ proj, int proj_stride, const unsigned long long* __restrict__ now,
               const unsigned long long* __restrict__ mark, const int* __restrict__ row_lo,
               const int* __restrict__ mark_after, int channels, long long layer_offset) {
    conv_window<4>(proj, proj_stride, now, mark, row_lo, mark_after, channels, layer_offset);
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

// A decode step's convolution and q/k norms in one kernel, for sequences of one row each: conv_rows' row, then
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

// The gates of value head h at row r: beta = sigmoid(b) and the log decay g = A * softplus(a + dt_bias) from
// proj's columns b_col + h and a_col + h.
__device__ __forceinline__ void head_log_gates(const __half* __restrict__ proj, size_t r, int proj_stride, int b_col,
                                               int a_col, int h, float a_h, float bias, float& beta, float& g) {
    beta = sigmoid_f(__half2float(proj[r * proj_stride + b_col + h]));
    const float a = __half2float(proj[r * proj_stride + a_col + h]) + bias;
    g = a_h * (a > 20.f ? a : log1pf(expf(a)));
}

// The same with the decay itself, exp(g): a decode row's.
__device__ __forceinline__ void head_gates(const __half* __restrict__ proj, size_t r, int proj_stride, int b_col,
                                           int a_col, int h, float a_h, float bias, float& beta, float& decay) {
    float g;
    head_log_gates(proj, r, proj_stride, b_col, a_col, h, a_h, bias, beta, g);
    decay = expf(g);
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

// A chunk's rows into a staging tile: s[i][d] = f[i] * of[(lo + i) * channels + d0 + d] (f null: the values as they
// are) for its m rows, zeros for the rest of its CHUNK. The block's threads, a value each in turn.
__device__ __forceinline__ void stage_rows(float (&s)[CHUNK][TILE + 1], const float* __restrict__ of, int lo, int m,
                                           int channels, int d0, const float* f) {
    for (int e = threadIdx.x; e < CHUNK * TILE; e += CHUNK_THREADS) {
        const int i = e / TILE, d = e % TILE;
        const float v = i < m ? of[(size_t)(lo + i) * channels + d0 + d] : 0.f;
        s[i][d] = f ? f[i] * v : v;
    }
}

// The chunked form's parts that need no state (engine/ops/delta_rule.py's `chunk`), for chunk `ch` of the step and
// value head h: rows [chunk_lo[ch], + chunk_rows[ch]) of conv (q | k | v, q and k normalized by l2_heads), the rest
// of its CHUNK rows zeros (beta = g = 0). With decay the cumulative log decay from the chunk's start, gaps[i][j] =
// exp(decay_i - decay_j) (j <= i) and T = (I + strictly_lower(diag(beta) K K^T * gaps))^-1 (forward
// substitution, a row at a time): writes, at (ch * nv + h) of each, values = T (beta v) and keys = T (beta
// exp(decay) k) (CHUNK, D), inner = lower(Q K^T * gaps) (CHUNK, CHUNK) and decay (CHUNK,). Block = (chunk, value
// head): grid (chunks, nv), CHUNK_THREADS threads; k, q and v staged TILE columns at a time.
template <int D>
__device__ __forceinline__ void delta_prep(const float* __restrict__ conv, const __half* __restrict__ proj,
                                           int proj_stride, int b_col, int a_col, const float* __restrict__ A,
                                           const float* __restrict__ dt_bias, const int* __restrict__ chunk_lo,
                                           const int* __restrict__ chunk_rows, float* __restrict__ values,
                                           float* __restrict__ keys, float* __restrict__ inner,
                                           float* __restrict__ decays, int nv, int kh, int tiled, int channels) {
    __shared__ float stage_a[CHUNK][TILE + 1], stage_b[CHUNK][TILE + 1];
    __shared__ float t[CHUNK][CHUNK + 1];
    __shared__ float beta[CHUNK], decay[CHUNK], k_scale[CHUNK];  // (k_scale: beta exp(decay), a row's once)
    after_producer();
    const int ch = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
    const int lo = chunk_lo[ch], m = chunk_rows[ch], kv = tiled ? h % kh : h / (nv / kh);
    const size_t at = (size_t)ch * nv + h;
    const float* q_of = conv + (size_t)kv * D;  // row i's q at q_of + (lo + i) * channels
    const float* k_of = conv + (size_t)(kh + kv) * D;
    const float* v_of = conv + (size_t)(2 * kh) * D + (size_t)h * D;
    if (tid < CHUNK) {
        float b = 0.f, g = 0.f;
        if (tid < m) head_log_gates(proj, (size_t)(lo + tid), proj_stride, b_col, a_col, h, A[h], dt_bias[h], b, g);
        beta[tid] = b;
        decay[tid] = g;
    }
    __syncthreads();
    if (tid == 0)
        for (int i = 1; i < CHUNK; i++) decay[i] += decay[i - 1];
    __syncthreads();
    if (tid < CHUNK) k_scale[tid] = beta[tid] * expf(decay[tid]);
    // K K^T and Q K^T: thread (ti, tj) their 4 x 4 block at rows 4 ti.., columns 4 tj.., summed in d's order
    const int ti = tid / 16, tj = tid % 16;
    float kk[4][4] = {}, qk[4][4] = {};
    for (int d0 = 0; d0 < D; d0 += TILE) {
        __syncthreads();
        stage_rows(stage_a, k_of, lo, m, channels, d0, nullptr);
        stage_rows(stage_b, q_of, lo, m, channels, d0, nullptr);
        __syncthreads();
        for (int d = 0; d < TILE; d++) {
            float kr[4], qr[4], kc[4];
#pragma unroll
            for (int a = 0; a < 4; a++) {
                kr[a] = stage_a[4 * ti + a][d];
                qr[a] = stage_b[4 * ti + a][d];
                kc[a] = stage_a[4 * tj + a][d];
            }
#pragma unroll
            for (int a = 0; a < 4; a++)
#pragma unroll
                for (int b = 0; b < 4; b++) {
                    kk[a][b] += kr[a] * kc[b];
                    qk[a][b] += qr[a] * kc[b];
                }
        }
    }
    float* inner_at = inner + at * CHUNK * CHUNK;
#pragma unroll
    for (int a = 0; a < 4; a++)
#pragma unroll
        for (int b = 0; b < 4; b++) {
            const int i = 4 * ti + a, j = 4 * tj + b;
            const float gap = j <= i ? expf(decay[i] - decay[j]) : 0.f;
            t[i][j] = j < i ? -(beta[i] * kk[a][b]) * gap : 0.f;
            inner_at[i * CHUNK + j] = j <= i ? qk[a][b] * gap : 0.f;
        }
    __syncthreads();
    // T row by row: t[i][j] += sum over j < p < i of t[i][p] t[p][j], from row i as it was (rows p < i are done)
    for (int i = 2; i < CHUNK; i++) {
        float v = 0.f;
        if (tid < i) {
            v = t[i][tid];
            for (int p = tid + 1; p < i; p++) v += t[i][p] * t[p][tid];
        }
        __syncthreads();
        if (tid < i) t[i][tid] = v;
        __syncthreads();
    }
    if (tid < CHUNK) t[tid][tid] = 1.f;
    // values and keys, TILE columns at a time: thread (warp w, lane c) rows 8 w.., column c; sums over j <= i
    const int c = tid % TILE, r0 = (tid / TILE) * 8;
    for (int d0 = 0; d0 < D; d0 += TILE) {
        __syncthreads();
        stage_rows(stage_a, v_of, lo, m, channels, d0, beta);
        stage_rows(stage_b, k_of, lo, m, channels, d0, k_scale);
        __syncthreads();
#pragma unroll
        for (int a = 0; a < 8; a++) {
            const int i = r0 + a;
            float u = 0.f, w = 0.f;
            for (int j = 0; j <= i; j++) {
                u += t[i][j] * stage_a[j][c];
                w += t[i][j] * stage_b[j][c];
            }
            values[(at * CHUNK + i) * D + d0 + c] = u;
            keys[(at * CHUNK + i) * D + d0 + c] = w;
        }
    }
    if (tid < CHUNK) decays[at * CHUNK + tid] = decay[tid];
}

// The chunked form's serial part: sequence s's chunks (seq_chunks[s] to seq_chunks[s + 1], in order) against its
// state of value head h, TILE of its columns a block (now[s] + layer_offset: (nv, D, D) fp32). Per chunk, from
// delta_prep's values, keys, inner and decay: fresh = values - keys S (what the state does not hold yet); out =
// exp(decay) (Q S) + inner fresh (n, nv, D) fp32; S = exp(decay_last) S + (K exp(decay_last - decay))^T fresh,
// copied into the mark after mark_after[s] / CHUNK chunks. Thread (row group y = tid / TILE, column x): fresh and
// out of rows 8 y.., S's rows (D / 8) y... Grid (D / TILE, nv, seqs), CHUNK_THREADS threads.
template <int D>
__device__ __forceinline__ void delta_chunks(const float* __restrict__ conv, const float* __restrict__ values,
                                             const float* __restrict__ keys, const float* __restrict__ inner,
                                             const float* __restrict__ decays, const int* __restrict__ chunk_lo,
                                             const int* __restrict__ chunk_rows, const int* __restrict__ seq_chunks,
                                             const unsigned long long* __restrict__ now,
                                             const unsigned long long* __restrict__ mark,
                                             const int* __restrict__ mark_after, float* __restrict__ out, int nv,
                                             int kh, int tiled, int channels, long long layer_offset) {
    constexpr int PER = D / 8;  // state rows a thread updates
    __shared__ float S[D][TILE];
    __shared__ float fresh[CHUNK][TILE + 1];
    __shared__ float decay[CHUNK], carry[CHUNK];
    after_producer();
    const int c0 = blockIdx.x * TILE, h = blockIdx.y, s = blockIdx.z, x = threadIdx.x % TILE, y = threadIdx.x / TILE;
    const int kv = tiled ? h % kh : h / (nv / kh);
    const long long at = layer_offset + (long long)h * D * D + c0 + x;  // S[h][k][c0 + x] is k * D further
    float* state = state_at(now, s, at);
    for (int k = y; k < D; k += 8) S[k][x] = state[(size_t)k * D];
    const int first = seq_chunks[s], last = seq_chunks[s + 1], save = mark_after[s] / CHUNK;
    for (int ch = first; ch < last; ch++) {
        const int lo = chunk_lo[ch], m = chunk_rows[ch];
        const size_t head_chunk = (size_t)ch * nv + h;
        __syncthreads();  // (S written, decay read: the chunk before is done)
        if (threadIdx.x < CHUNK) decay[threadIdx.x] = decays[head_chunk * CHUNK + threadIdx.x];
        __syncthreads();
        if (threadIdx.x < CHUNK) carry[threadIdx.x] = expf(decay[CHUNK - 1] - decay[threadIdx.x]);
        const float* key_rows = keys + head_chunk * CHUNK * D;
        const float* value_rows = values + head_chunk * CHUNK * D;
        const float* q_rows[8];  // this thread's rows' q (a padding row reads the last real one's: its sums not kept)
#pragma unroll
        for (int a = 0; a < 8; a++) q_rows[a] = conv + (size_t)(lo + min(8 * y + a, m - 1)) * channels + kv * D;
        float acc[8] = {}, qs[8] = {};
        for (int k = 0; k < D; k++) {
            const float sk = S[k][x];
#pragma unroll
            for (int a = 0; a < 8; a++) {
                acc[a] += key_rows[(size_t)(8 * y + a) * D + k] * sk;
                qs[a] += q_rows[a][k] * sk;
            }
        }
#pragma unroll
        for (int a = 0; a < 8; a++) fresh[8 * y + a][x] = value_rows[(size_t)(8 * y + a) * D + c0 + x] - acc[a];
        __syncthreads();
        const float* inner_rows = inner + head_chunk * CHUNK * CHUNK;
#pragma unroll
        for (int a = 0; a < 8; a++) {
            const int i = 8 * y + a;
            if (i >= m) continue;
            float o = expf(decay[i]) * qs[a];
            for (int j = 0; j <= i; j++) o += inner_rows[i * CHUNK + j] * fresh[j][x];
            out[((size_t)(lo + i) * nv + h) * D + c0 + x] = o;
        }
        const float keep = expf(decay[CHUNK - 1]);
        float next[PER];
#pragma unroll
        for (int p = 0; p < PER; p++) next[p] = keep * S[PER * y + p][x];
        for (int j = 0; j < m; j++) {
            const float f = carry[j] * fresh[j][x];
            const float* k_row = conv + (size_t)(lo + j) * channels + (kh + kv) * D + PER * y;
#pragma unroll
            for (int p = 0; p < PER; p++) next[p] += k_row[p] * f;
        }
        __syncthreads();  // (every thread's reads of S for this chunk done)
#pragma unroll
        for (int p = 0; p < PER; p++) S[PER * y + p][x] = next[p];
        if (ch - first + 1 == save) {
            float* kept = state_at(mark, s, at);
#pragma unroll
            for (int p = 0; p < PER; p++) kept[(size_t)(PER * y + p) * D] = next[p];
        }
    }
    __syncthreads();
    for (int k = y; k < D; k += 8) state[(size_t)k * D] = S[k][x];
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

// A decode step's delta rule and gated norm in one kernel, for sequences of one row each: one position of the
// recurrent form, then gated_norm's value. Block = (sequence, value head): grid (nv, seqs), D threads, a column each.
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
    extern "C" __global__ void __launch_bounds__(CHUNK_THREADS)                                                     \
    delta_prep_d##D(const float* __restrict__ conv, const __half* __restrict__ proj, int proj_stride, int b_col,     \
                    int a_col, const float* __restrict__ A, const float* __restrict__ dt_bias,                     \
                    const int* __restrict__ chunk_lo, const int* __restrict__ chunk_rows, float* __restrict__ values, \
                    float* __restrict__ keys, float* __restrict__ inner, float* __restrict__ decays, int nv, int kh, \
                    int tiled, int channels) {                                                                      \
        delta_prep<D>(conv, proj, proj_stride, b_col, a_col, A, dt_bias, chunk_lo, chunk_rows, values, keys, inner,  \
                      decays, nv, kh, tiled, channels);                                                            \
    }                                                                                                               \
    extern "C" __global__ void __launch_bounds__(CHUNK_THREADS)                                                     \
    delta_chunks_d##D(const float* __restrict__ conv, const float* __restrict__ values,                          \
                      const float* __restrict__ keys, const float* __restrict__ inner,                             \
                      const float* __restrict__ decays,                                                            \
                      const int* __restrict__ chunk_lo, const int* __restrict__ chunk_rows,                        \
                      const int* __restrict__ seq_chunks, const unsigned long long* __restrict__ now,              \
                      const unsigned long long* __restrict__ mark, const int* __restrict__ mark_after,             \
                      float* __restrict__ out, int nv, int kh, int tiled, int channels, long long layer_offset) {   \
        delta_chunks<D>(conv, values, keys, inner, decays, chunk_lo, chunk_rows, seq_chunks, now, mark, mark_after, \
                        out, nv, kh, tiled, channels, layer_offset);                                               \
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
