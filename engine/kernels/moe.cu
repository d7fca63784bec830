// Mixture-of-experts layers (qwen3moe) on the GPU with no host round trip: the route is computed
// on the device and every later kernel reads the chosen experts from device memory, so a decode
// step stays one captured graph. Experts stay as GGUF stacks them: expert e's rows of a stacked
// tensor (ffn_{gate,up,down}_exps) are rows e*m .. e*m + m, in blocks of one type (or fp16).
// NumPy reference: engine/ops/moe.py (route, run_experts), checked by tools/device/gpu_kernels_check.py.
//
//   router_gemm(w, x, out, n, E, dim)    a prompt chunk's router logits: out (n, E) fp32 = x (n, dim) fp16 .
//                                        w (E, dim) fp32, tiled through shared memory
//   moe_route(logits, ids, wts, E, k, norm)   per token: softmax over the E experts, the k most
//                                        probable (ties to the lower index), rescaled to sum to 1
//                                        when norm; ids (n, k) int32, wts (n, k) fp32
//   router_route(...)                    both for each row of a decode step, in one launch
//   moe_matvec_<T>(...)                  a decode step's gate and up: the chosen experts' rows read in
//                                        their blocks (dp4a against the row in 8 bits, as quant.cu's
//                                        matvecs), one output row per (token, chosen expert, matrix)
//   moe_act_<T>(...)                     a decode step's gate and up with SwiGLU after them, one launch
//                                        (gate and up of one block type)
//   moe_down_<T>(...)                    a decode step's down: each token's chosen experts' outputs
//                                        summed with their weights in one pass
//   moe_sort(ids, entries, E, ...)       a prompt chunk: its (token, slot) entries grouped by expert
//   moe_gemm_<T>(...)                    a prompt chunk: per expert, its entries' rows times its
//                                        matrix on tensor cores (mma.sync), the blocks decoded into
//                                        shared memory tile by tile (no fp16 copy of the experts)
//   moe_combine(y, inv, wts, out, ...)   out[t] = sum_j wts[t, j] * y[entry (t, j)'s row]
//
// A decode step's kernels take all its tokens in one launch (a grid dimension per token); each
// token's values are computed by the same code in the same order as when it is alone, so a row's
// output does not depend on the batch beside it.
#include "block_sum.cuh"
#include "quant_blocks.cuh"
#include "matvec.cuh"
#include "mma.cuh"
#include "pdl.cuh"
#include "q8.cuh"
#include "swiglu.cuh"

#ifndef MOE_UNROLL
#define MOE_UNROLL 2  // units a lane of moe_matvec has in flight: an expert's row of 2048 is 2 a lane
#endif
constexpr int MAX_EXPERTS = 512;  // one warp holds a token's router probabilities: 16 a lane (Qwen3-Next's 512)
#define NEG_INF (-__int_as_float(0x7f800000))

// An expert stack as the kernels read it: expert e's rows start at table[e] (a device address: its place in a stack
// on the GPU, a slot of an expert cache, or page-locked host memory the GPU reads over the link: the same blocks
// wherever they are, so the same bits). A resident stack's table is its base plus e times an expert's bytes.
using Table = const unsigned long long* __restrict__;

__device__ __forceinline__ const u8* expert_at(Table table, int e) { return reinterpret_cast<const u8*>(table[e]); }

constexpr int ROUTER_THREADS = 128;  // a block per (expert, token): every thread's loads in flight at once

// The logit of expert e for row xr (dim fp16 values), by a block of ROUTER_THREADS (every thread gets
// it): dim % 4 == 0. Each thread's float4 pieces at once, then block_sum. (A warp an expert read its
// row in four rounds of loads.)
__device__ __forceinline__ float router_logit(const float* __restrict__ w, const __half* __restrict__ xr, int e,
                                             int dim) {
    const float* row = w + (size_t)e * dim;
    float acc = 0.f;
#pragma unroll 4
    for (int i = threadIdx.x * 4; i < dim; i += ROUTER_THREADS * 4) {
        const float4 a = *reinterpret_cast<const float4*>(row + i);
        const float2 b0 = __half22float2(*reinterpret_cast<const __half2*>(xr + i));
        const float2 b1 = __half22float2(*reinterpret_cast<const __half2*>(xr + i + 2));
        acc += a.x * b0.x + a.y * b0.y + a.z * b1.x + a.w * b1.y;
    }
    return block_sum<ROUTER_THREADS>(acc);
}

constexpr int ROUTE_TILE = 64;     // router_gemm: tokens and experts a block
constexpr int ROUTE_K = 32;        // columns of dim a step
constexpr int ROUTE_THREADS = 256; // 16 x 16 threads, each 4 tokens x 4 experts

// grid (ceil(E / ROUTE_TILE), ceil(n / ROUTE_TILE)), ROUTE_THREADS: out (n, E) fp32 = x (n, dim) fp16 . w (E, dim)^T
// fp32 for a prompt chunk's rows: tiles of both through shared memory, each output the sum over dim in order, one fmaf
// a term, so a row's logits are the same in any chunk. (A block of 128 threads for each (expert, token), as a decode
// step's router_route, is 2M blocks for a 4K chunk on 512 experts, each reading its two rows again.) dim % ROUTE_K == 0.
extern "C" __global__ void __launch_bounds__(ROUTE_THREADS) router_gemm(const float* __restrict__ w,
                                                                        const __half* __restrict__ x,
                                                                        float* __restrict__ out, int n, int experts,
                                                                        int dim) {
    after_producer();
    __shared__ float ws[ROUTE_K][ROUTE_TILE + 1];  // [column][expert]
    __shared__ float xs[ROUTE_K][ROUTE_TILE + 1];  // [column][token]
    const int e0 = blockIdx.x * ROUTE_TILE, t0 = blockIdx.y * ROUTE_TILE;
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;  // experts e0 + tx + 16 i, tokens t0 + ty + 16 j
    float acc[4][4] = {};
    for (int k0 = 0; k0 < dim; k0 += ROUTE_K) {
        for (int i = threadIdx.x; i < ROUTE_TILE * ROUTE_K; i += ROUTE_THREADS) {  // a row's 32 columns a warp
            const int r = i / ROUTE_K, c = i % ROUTE_K;
            ws[c][r] = e0 + r < experts ? w[(size_t)(e0 + r) * dim + k0 + c] : 0.f;
            xs[c][r] = t0 + r < n ? __half2float(x[(size_t)(t0 + r) * dim + k0 + c]) : 0.f;
        }
        __syncthreads();
#pragma unroll 8
        for (int c = 0; c < ROUTE_K; ++c) {
            float a[4], b[4];
#pragma unroll
            for (int q = 0; q < 4; ++q) b[q] = ws[c][tx + 16 * q], a[q] = xs[c][ty + 16 * q];
#pragma unroll
            for (int j = 0; j < 4; ++j)
#pragma unroll
                for (int q = 0; q < 4; ++q) acc[j][q] = fmaf(a[j], b[q], acc[j][q]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int t = t0 + ty + 16 * j, e = e0 + tx + 16 * q;
            if (t < n && e < experts) out[(size_t)t * experts + e] = acc[j][q];
        }
}

// One token's route by one warp, from its E logits l: lane j < k ends holding the j-th choice. k <= 32.
// The logits are read through L2 (__ldcg): in router_route they were written by other blocks.
__device__ __forceinline__ void route_token(const float* l, int* __restrict__ ids, float* __restrict__ wts,
                                            int experts, int k, int normalize) {
    const int lane = threadIdx.x & 31;
    constexpr int PER_LANE = MAX_EXPERTS / 32;
    float p[PER_LANE];
    float mx = NEG_INF;
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) {
        const int e = lane + 32 * i;
        p[i] = e < experts ? __ldcg(l + e) : NEG_INF;
        mx = fmaxf(mx, p[i]);
    }
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) {
        p[i] = lane + 32 * i < experts ? expf(p[i] - mx) : 0.f;
        sum += p[i];
    }
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) p[i] = lane + 32 * i < experts ? p[i] / sum : -1.f;  // -1: never chosen
    float mine = 0.f;
    int my_id = 0;
    for (int j = 0; j < k; ++j) {
        float best = -2.f;
        int idx = 0x7fffffff;
#pragma unroll
        for (int i = 0; i < PER_LANE; ++i)
            if (p[i] > best) best = p[i], idx = lane + 32 * i;  // ascending within a lane: ties keep the lower
        for (int o = 16; o > 0; o >>= 1) {
            const float ob = __shfl_xor_sync(0xffffffffu, best, o);
            const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
            if (ob > best || (ob == best && oi < idx)) best = ob, idx = oi;
        }
#pragma unroll
        for (int i = 0; i < PER_LANE; ++i)
            if (lane + 32 * i == idx) p[i] = -1.f;
        if (lane == j) mine = best, my_id = idx;
    }
    float total = mine;  // lanes >= k hold 0
    for (int o = 16; o > 0; o >>= 1) total += __shfl_xor_sync(0xffffffffu, total, o);
    if (lane < k) ids[lane] = my_id, wts[lane] = normalize ? mine / total : mine;
}

// grid (n,), 32 threads: token t's route from its logits (n, E).
extern "C" __global__ void moe_route(const float* __restrict__ logits, int* __restrict__ ids, float* __restrict__ wts,
                                     int experts, int k, int normalize) {
    after_producer();
    const int t = blockIdx.x;
    route_token(logits + (size_t)t * experts, ids + t * k, wts + t * k, experts, k, normalize);
}

// A decode step's router and route in one launch: grid (E, n), ROUTER_THREADS; token t's blocks
// write its experts' logits, and the last of them to finish (an atomic counter per token, zero at
// rest, reset by it) routes the token: router_logit per block, then moe_route's choices.
extern "C" __global__ void __launch_bounds__(ROUTER_THREADS) router_route(
    const float* __restrict__ w, const __half* __restrict__ x, float* __restrict__ logits, int* __restrict__ counter,
    int* __restrict__ ids, float* __restrict__ wts, int experts, int dim, int k, int normalize) {
    after_producer();
    __shared__ bool last;
    const int e = blockIdx.x, t = blockIdx.y;
    logits += (size_t)t * experts;
    const float acc = router_logit(w, x + (size_t)t * dim, e, dim);
    if (threadIdx.x == 0) {
        logits[e] = acc;
        __threadfence();
        last = atomicAdd(counter + t, 1) == (int)gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return;
    if (threadIdx.x < 32) route_token(logits, ids + t * k, wts + t * k, experts, k, normalize);
    if (threadIdx.x == 0) counter[t] = 0;
}

// A decode step's gate and up rows: grid (ceil(m / (MV_WARPS * MV_ROWS)), 2 * chosen or chosen, tokens);
// block row b of token t serves its chosen expert j = b % chosen of stack w (b < chosen) or w2
// (b >= chosen): y[(t * chosen + j) * y_stride + (b / chosen) * m + r] = W_ids[t, j] row r . x_t
// (x: a row of k / 32 units, or k halves for F16, per token).
template <class T, typename X>
__device__ __forceinline__ void moe_matvec(const Table w, const Table w2, int m, int k,
                                           const int* __restrict__ ids, int chosen, const X* __restrict__ x,
                                           __half* __restrict__ y, int y_stride) {
    const int row0 = warp_row0();
    if (row0 >= m) return;
    const int t = blockIdx.z, j = blockIdx.y % chosen, second = blockIdx.y / chosen;
    const u8* we = expert_at(second ? w2 : w, ids[t * chosen + j]);
    const X* xt = x + (size_t)t * (is_f16<T> ? k : k / 32);
    float acc[MV_ROWS] = {};
    if constexpr (is_f16<T>)
        rows_dot_f16<MOE_UNROLL>(reinterpret_cast<const __half*>(we), xt, row0, m, k, acc);
    else
        rows_dot_q8<T, MOE_UNROLL>(we, xt, row0, m, k, acc);
    reduce_store(acc, y + (size_t)(t * chosen + j) * y_stride + (size_t)second * m, row0, m);
}

// A decode step's gate and up rows with SwiGLU after them, for stacks of one block type: act row t * chosen + j
// (ffn fp16 values) = silu(gate_e row c . x_t) * (up_e row c . x_t) for e = ids[t, j], and its Q8 units (q8: ffn
// / 32 a row, or null). grid (ffn / 32, chosen, tokens), 32 warps: warp w takes column 32 b + w, its gate row and
// its up row, each the sum moe_matvec makes of it (rows_dot_q8's chain, reduce_store's sum), rounded to fp16 as
// moe_matvec stores it; the products through silu_mul's silu_times, so act has the bits of moe_matvec then
// silu_mul, in one launch.
template <class T>
__device__ __forceinline__ void moe_act(const Table gate, const Table up, int ffn, int k,
                                        const int* __restrict__ ids, int chosen, const Q8* __restrict__ x,
                                        __half* __restrict__ act, Q8* __restrict__ q8) {
    __shared__ float products[32];
    after_producer();
    const int t = blockIdx.z, j = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int c = blockIdx.x * 32 + warp;
    const size_t rb = row_bytes<T>(k);
    const u8 *ge = expert_at(gate, ids[t * chosen + j]), *ue = expert_at(up, ids[t * chosen + j]);
    const Q8* xt = x + (size_t)t * (k / 32);
    float g[MV_ROWS] = {}, u[MV_ROWS] = {};  // (the first of each: a row alone)
#pragma unroll MOE_UNROLL
    for (int s = lane; s < k / 32; s += 32) {
        unit_dot_q8<T>(ge, rb, c, c + 1, s, xt + s, 1.f, g);
        unit_dot_q8<T>(ue, rb, c, c + 1, s, xt + s, 1.f, u);
    }
    const float gv = __half2float(__float2half(warp_total(g[0]))), uv = __half2float(__float2half(warp_total(u[0])));
    if (lane == 0) products[warp] = silu_times(gv, uv);
    __syncthreads();
    if (warp) return;
    float v[8] = {};  // lanes 0-3: eight products each (store_octet)
    if (lane < 4)
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = products[8 * lane + e];
    const size_t row = (size_t)t * chosen + j;
    store_octet(act + row * ffn + blockIdx.x * 32 + 8 * lane, q8 ? q8 + row * (ffn / 32) + blockIdx.x : nullptr, v,
                lane < 4);
}

// A decode step's down rows of each token's chosen experts, summed with their weights: grid
// (ceil(m / MV_ROWS), tokens), MV_WARPS warps all on the block's MV_ROWS rows; y[t, r] = sum over j of
// wts[t, j] * (W_ids[t, j] row r . x_{t, j}), x_{t, j} row t * chosen + j of x (k values: k / 32 units,
// or k halves). The block's threads take the (expert, unit) pairs of its rows in turn, so every chosen
// expert's blocks are in flight at once: the rows are short (the experts' ffn, 768 in Qwen3-30B-A3B:
// 24 units each, 192 pairs for 8 experts), and a warp of them alone was latency-bound (0.8 TB/s). Each
// row's partials are summed by block_sum, in a fixed order: the result does not depend on the batch.
template <class T, typename X>
__device__ __forceinline__ void moe_down(const Table w, int m, int k, const int* __restrict__ ids,
                                         int chosen, const X* __restrict__ x, const float* __restrict__ wts,
                                         __half* __restrict__ y) {
    const int row0 = blockIdx.x * MV_ROWS;
    if (row0 >= m) return;  // the whole block
    const int t = blockIdx.y;
    ids += t * chosen, wts += t * chosen, y += (size_t)t * m;
    const size_t rb = row_bytes<T>(k);
    const int units = k / 32;
    x += (size_t)t * chosen * (is_f16<T> ? k : units);
    float acc[MV_ROWS] = {};
#pragma unroll 2
    for (int i = threadIdx.x; i < chosen * units; i += MV_WARPS * 32) {
        const int j = i / units, s = i % units;
        const u8* we = expert_at(w, ids[j]);
        if constexpr (is_f16<T>)
            unit_dot_f16(reinterpret_cast<const __half*>(we), k, row0, m, s, x + (size_t)j * k + s * 32, wts[j], acc);
        else
            unit_dot_q8<T>(we, rb, row0, m, s, x + (size_t)j * units + s, wts[j], acc);
    }
#pragma unroll
    for (int r = 0; r < MV_ROWS; ++r) {
        const float a = block_sum<MV_WARPS * 32>(acc[r]);
        if (threadIdx.x == 0 && row0 + r < m) store(y, row0 + r, a);
    }
}

// ---------------------------------------------------------------- prompt chunks: grouped GEMM

constexpr int GEMM_BM = 64;             // entries (rows) per tile
constexpr int GEMM_BN = 64;             // output features per tile
constexpr int GEMM_BK = 64;             // columns per step: two units, one decoded by each thread
constexpr int GEMM_ROW = GEMM_BK + 8;   // fp16 per shared row, padded: ldmatrix rows on distinct banks
constexpr int GEMM_THREADS = 128;       // 2 x 2 warps of 32 x 32 outputs

// One block. offsets[e] .. offsets[e + 1]: expert e's entries' positions in order[] (entry t*k + j
// of ids); inv[entry] = its position; tiles[e]: the first GEMM row tile of expert e (tiles of
// GEMM_BM entries; tiles[E]: how many). Within an expert the order is whatever the atomics give:
// each output row is computed alone, so the order changes no value.
extern "C" __global__ void moe_sort(const int* __restrict__ ids, int entries, int experts, int* __restrict__ offsets,
                                    int* __restrict__ tiles, int* __restrict__ order, int* __restrict__ inv) {
    after_producer();
    __shared__ int count[MAX_EXPERTS], fill[MAX_EXPERTS];
    for (int e = threadIdx.x; e < experts; e += blockDim.x) count[e] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < entries; i += blockDim.x) atomicAdd(&count[ids[i]], 1);
    __syncthreads();
    if (threadIdx.x == 0) {
        int off = 0, tile = 0;
        for (int e = 0; e < experts; ++e) {
            offsets[e] = fill[e] = off, tiles[e] = tile;
            off += count[e], tile += (count[e] + GEMM_BM - 1) / GEMM_BM;
        }
        offsets[experts] = off, tiles[experts] = tile;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < entries; i += blockDim.x) {
        const int p = atomicAdd(&fill[ids[i]], 1);
        order[p] = i, inv[i] = p;
    }
}

// grid (an upper bound on the row tiles: ceil(entries / BM) + E, ceil(m / BN)), GEMM_THREADS.
// y[p, :m] (row stride y_stride) = A_p . W_e^T for the entries p of expert e, where A_p is row
// order[p] / gather of x (a token's normed row, shared by its k entries) or, with gather 0, row p
// (the entries' own rows, already grouped). k % 32 == 0, m % 2 == 0.
template <class T>
__device__ __forceinline__ void moe_gemm(const __half* __restrict__ x, int x_stride, int gather,
                                         const int* __restrict__ order, const int* __restrict__ offsets,
                                         const int* __restrict__ tiles, int experts, const Table w, int m,
                                         int k, __half* __restrict__ y, int y_stride) {
    __shared__ __align__(16) __half as[GEMM_BM * GEMM_ROW];
    __shared__ __align__(16) __half bs[GEMM_BN * GEMM_ROW];
    __shared__ int src_row[GEMM_BM];
    const int tile = blockIdx.x;
    if (tile >= tiles[experts]) return;
    int e = 0, hi = experts - 1;  // the last expert whose tiles start at or before this one (never an empty one)
    while (e < hi) {
        const int mid = (e + hi + 1) >> 1;
        if (tiles[mid] <= tile) e = mid; else hi = mid - 1;
    }
    const int p0 = offsets[e] + (tile - tiles[e]) * GEMM_BM, p_end = offsets[e + 1];
    const int n0 = blockIdx.y * GEMM_BN;
    if (threadIdx.x < GEMM_BM) {
        const int p = p0 + threadIdx.x;
        src_row[threadIdx.x] = p < p_end ? (gather ? order[p] / gather : p) : -1;
    }
    __syncthreads();
    const size_t rb = row_bytes<T>(k);
    const u8* we = expert_at(w, e);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int wm = (warp >> 1) * 32, wn = (warp & 1) * 32;
    float c[2][4][4] = {};
    for (int k0 = 0; k0 < k; k0 += GEMM_BK) {
        for (int c16 = threadIdx.x; c16 < GEMM_BM * GEMM_BK / 8; c16 += GEMM_THREADS) {  // A: 16 bytes a copy
            const int r = c16 / (GEMM_BK / 8), col = (c16 % (GEMM_BK / 8)) * 8, row = src_row[r];
            const bool ok = row >= 0 && k0 + col < k;
            cp_async16(as + r * GEMM_ROW + col, x + (ok ? (size_t)row * x_stride + k0 + col : 0), ok);
        }
        cp_async_commit();
        {  // B: GEMM_BN rows x two units, one unit a thread, decoded to fp16 while A's copies fly
            const int r = threadIdx.x >> 1, half = threadIdx.x & 1, s = k0 / 32 + half;
            float v[32];
            if (n0 + r < m && s < k / 32) {
                values<T>(we + (size_t)(n0 + r) * rb, s, v);
            } else {
#pragma unroll
                for (int j = 0; j < 32; ++j) v[j] = 0.f;
            }
            store32(bs + r * GEMM_ROW + half * 32, v);
        }
        cp_async_wait<0>();
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < GEMM_BK / 16; ++kk) {
            uint32_t a[2][4];
#pragma unroll
            for (int mi = 0; mi < 2; ++mi)
                ldmatrix_x4(a[mi], as + (wm + mi * 16 + (lane & 15)) * GEMM_ROW + kk * 16 + (lane >> 4) * 8);
#pragma unroll
            for (int np = 0; np < 2; ++np) {  // two n-tiles of 8 a load: (n, k 0-7), (n, k 8-15), (n + 8, ...)
                uint32_t b[4];
                ldmatrix_x4(b, bs + (wn + np * 16 + (lane & 7) + ((lane >> 4) << 3)) * GEMM_ROW + kk * 16 +
                                   ((lane >> 3) & 1) * 8);
#pragma unroll
                for (int mi = 0; mi < 2; ++mi) {
                    mma_16x8x16(c[mi][2 * np], a[mi], b[0], b[1]);
                    mma_16x8x16(c[mi][2 * np + 1], a[mi], b[2], b[3]);
                }
            }
        }
        __syncthreads();
    }
    const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int p = p0 + wm + mi * 16 + g + 8 * h, col = n0 + wn + ni * 8 + 2 * t4;
                if (p < p_end && col < m)
                    *reinterpret_cast<__half2*>(y + (size_t)p * y_stride + col) =
                        __floats2half2_rn(c[mi][ni][2 * h], c[mi][ni][2 * h + 1]);
            }
}

// grid over n * dim / 8 (one thread per 8 values): out (n, dim) fp16 = sum over j of
// wts[t, j] * y[inv[t k + j]] in fp32, j ascending. dim % 8 == 0.
extern "C" __global__ void moe_combine(const __half* __restrict__ y, const int* __restrict__ inv,
                                       const float* __restrict__ wts, __half* __restrict__ out, int n, int k, int dim) {
    after_producer();
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    const int per_row = dim / 8;
    if (i >= (long long)n * per_row) return;
    const int t = (int)(i / per_row), col = (int)(i % per_row) * 8;
    float acc[8] = {};
    for (int j = 0; j < k; ++j) {
        const float wj = wts[t * k + j];
        const uint4 raw = *reinterpret_cast<const uint4*>(y + (size_t)inv[t * k + j] * dim + col);
        const __half2* h = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const float2 f = __half22float2(h[q]);
            acc[2 * q] += wj * f.x, acc[2 * q + 1] += wj * f.y;
        }
    }
    __half2 h[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) h[q] = __floats2half2_rn(acc[2 * q], acc[2 * q + 1]);
    *reinterpret_cast<uint4*>(out + (size_t)t * dim + col) = *reinterpret_cast<uint4*>(h);
}

#define MOE_KERNELS(T, X)                                                                                        \
    extern "C" __global__ void __launch_bounds__(MV_WARPS * 32)                                                  \
        moe_matvec_##T(const Table w, const Table w2, int m, int k, const int* ids, int chosen, const X* x,         \
                       __half* y, int y_stride) {                                                                \
        after_producer();                                                                                        \
        moe_matvec<T>(w, w2, m, k, ids, chosen, x, y, y_stride);                                                 \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(MV_WARPS * 32)                                                  \
        moe_down_##T(const Table w, int m, int k, const int* ids, int chosen, const X* x, const float* wts,        \
                     __half* y) {                                                                               \
        after_producer();                                                                                       \
        moe_down<T>(w, m, k, ids, chosen, x, wts, y);                                                            \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(GEMM_THREADS)                                                   \
        moe_gemm_##T(const __half* x, int x_stride, int gather, const int* order, const int* offsets,            \
                     const int* tiles, int experts, const Table w, int m, int k, __half* y, int y_stride) {         \
        after_producer();                                                                                         \
        moe_gemm<T>(x, x_stride, gather, order, offsets, tiles, experts, w, m, k, y, y_stride);                 \
    }

#define MOE_ACT(T)                                                                                               \
    extern "C" __global__ void __launch_bounds__(1024)                                                          \
        moe_act_##T(const Table gate, const Table up, int ffn, int k, const int* ids, int chosen, const Q8* x,       \
                    __half* act, Q8* q8) {                                                                       \
        moe_act<T>(gate, up, ffn, k, ids, chosen, x, act, q8);                                                   \
    }
#define MOE_QUANT_KERNELS(T) MOE_KERNELS(T, Q8) MOE_ACT(T)

MOE_QUANT_KERNELS(Q4_0)
MOE_QUANT_KERNELS(Q4_1)
MOE_QUANT_KERNELS(Q5_0)
MOE_QUANT_KERNELS(Q5_1)
MOE_QUANT_KERNELS(Q8_0)
MOE_QUANT_KERNELS(Q4_K)
MOE_QUANT_KERNELS(Q5_K)
MOE_QUANT_KERNELS(Q6_K)
MOE_QUANT_KERNELS(IQ2_XXS)
MOE_QUANT_KERNELS(IQ2_XS)
MOE_QUANT_KERNELS(IQ2_S)
MOE_QUANT_KERNELS(IQ3_XXS)
MOE_QUANT_KERNELS(IQ3_S)
MOE_QUANT_KERNELS(IQ4_NL)
MOE_QUANT_KERNELS(IQ4_XS)
MOE_KERNELS(F16, __half)
