// Weights in their GGUF block layout (ggml-common.h, decoded by quant_blocks.cuh), read on the GPU. The kernels:
//   dequant_<T>(src, y, units, cols)          blocks -> fp16 (rows, cols): load time with
//                                              --weights fp16, and a prompt chunk's GEMM scratch
//   embed_<T>(src, ids, y, units, cols)       rows ids[r] -> fp32 (n, cols): the token embedding
//   matvec_<T>_n<NB>[_f32](w, xq, y, m, k, ldy, stage)
//                                             y (NB, m) = x (NB, k) @ W (m, k)^T, the blocks read
//                                              directly (decode steps of NB sequences, the head):
//                                              integer dot products (dp4a) against x quantized to 8
//                                              bits per 32 values by quantize_q8, as llama.cpp's MMVQ;
//                                              with stage > 0 each warp's rows come into shared memory
//                                              by one bulk copy first (stage.cuh; stage = bytes a warp)
//   matvec2_<TA>_<TB>(wa, wb, xq, y, ma, mb, k, blocks_a, stage_a, stage_b)
//                                             the same for one row of x against two stacked parts of
//                                              types TA and TB in one launch
//   matvec_act_<T>(wg, wu, xq, act, q8, k)    one decode row's gate and up matvecs with SwiGLU in their epilogue
//   matvec_norm_<T>(w, xq, delta, m, k, stage, x, nw, out, q8, eps, counter)
//                                             one decode row's matvec with the residual add and RMSNorm after
//                                              it in its last block (the next matvec's input in 8 bits)
// (fp16 weights against a decode batch: mmv.cu, on the tensor cores)
// NumPy reference: gguf.quants.dequantize, engine.core.quantized.quantize_q8 (tools/device/gpu_kernels_check.py).
#include "quant_blocks.cuh"
#include "add_norm.cuh"
#include "matvec.cuh"
#include "parts.cuh"
#include "pdl.cuh"
#include "stage.cuh"
#include "swiglu.cuh"
#ifndef MV_PREFETCH
#define MV_PREFETCH 1024  // bytes of each weight row a warp asks L2 for before it waits for x (pdl.cuh)
#endif
#ifndef MV_SOLO_ROWS
#define MV_SOLO_ROWS 1  // weight rows a warp at one row of x (a lone decode step): more warps, more of
#endif                  // each row in flight (engine.kernels.matvec_rows says the same)
#ifndef MV_WIDE_FROM
#define MV_WIDE_FROM 8  // a launch of more rows of x than this ...
#endif
#ifndef MV_WIDE_ROWS
#define MV_WIDE_ROWS MV_ROWS  // ... gives each warp this many weight rows: a knob for tools/profiling/matvec_wide_times.py
#endif                        // (4 and 8 were slower on the 8B shapes' big matrices); the launcher assumes MV_ROWS

// One thread per unit: out row r = source row ids[r] (or r), values [32 s, 32 s + 32).
template <class T, typename Out>
__device__ __forceinline__ void dequant_rows(const u8* __restrict__ src, const long long* __restrict__ ids,
                                             Out* __restrict__ y, long long units, int cols) {
    after_producer();
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= units) return;
    const int per_row = cols / 32, s = (int)(i % per_row);
    const long long r = i / per_row, src_row = ids ? ids[r] : r;
    float v[32];
    values<T>(src + src_row * row_bytes<T>(cols), s, v);
    store32(y + r * cols + s * 32, v);
}

// x: (units * 32,) fp16 -> (units,) Q8, one thread a unit.
extern "C" __global__ void quantize_q8(const __half* __restrict__ x, Q8* __restrict__ out, int units) {
    after_producer();
    const int u = blockIdx.x * blockDim.x + threadIdx.x;
    if (u >= units) return;
    float v[32];
    load_half32(x + 32 * u, v);
    quantize_unit(v, out + u);
}

// y (NB, m; rows ldy apart) = x (NB, k) @ W (m, k)^T: W in blocks against the rows of x in 8 bits (Q8 units,
// NB * k / 32 of them). A decode step of one sequence is NB = 1; a batch of up to MAX_NB rows is
// one launch (more go in several), each row reduced as it would be alone (matvec.cuh).
// stage: 0, or the bytes of shared memory a warp has (its R rows, R * rb a multiple of 16, w 16-byte
// aligned, NB = 1: the launcher checks). Staged, a warp's lane 0 asks for all of its rows with one bulk copy
// before the kernel waits for its producer (no kernel writes weights), so the rows stream in while
// the norm or attention before it finishes; the arithmetic is the same either way, in the same order.
template <class T, int NB, typename Out>
__device__ __forceinline__ void matvec_q8(const u8* __restrict__ w, const Q8* __restrict__ xq, Out* __restrict__ y,
                                          int m, int k, int ldy, int stage, int block = -1) {
    constexpr int R = NB == 1 ? MV_SOLO_ROWS : NB > MV_WIDE_FROM ? MV_WIDE_ROWS : MV_ROWS;  // more rows of x: more
    // weight rows a warp (each x unit it loads serves them all); alone, more units of one row in flight
    extern __shared__ __align__(16) u8 staged_rows[];  // MV_WARPS * stage bytes
    __shared__ __align__(8) unsigned long long arrived[MV_WARPS];
    const int row0 = warp_row0<R>(block), warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int rows = row0 < m ? min(R, m - row0) : 0;
    const size_t rb = row_bytes<T>(k);
    const u8* src = w + row0 * rb;
    u8* dst = staged_rows + warp * stage;
    constexpr bool kStaged = NB == 1 && STAGE_BULK;  // a lone row of x only: in the batch kernels the second
    // path's registers spill (and their time is the dot products', not the wait)
    if (rows && stage && kStaged) {
        if (lane == 0) bulk_copy(dst, src, rows * rb, &arrived[warp]);
        __syncwarp();  // the barrier is armed before any lane waits on it
    } else if (rows) {  // the weights' first bytes on their way while the kernel before this one finishes
        prefetch_rows_l2(src, rb, rows, min(rb, (size_t)MV_PREFETCH), lane, 32);
    }
    after_producer();
    if (!rows) return;
    BatchAcc<NB, R> acc = {};
    if (stage && kStaged) {
        bulk_wait(&arrived[warp]);
        rows_dot_q8_batch<T, NB, R>(dst, xq, 0, rows, k, acc);
    } else {
        rows_dot_q8_batch<T, NB, R>(w, xq, row0, m, k, acc);
    }
    reduce_store_batch<NB, R>(acc, y, row0, m, ldy);
}

// Two parts of a stacked matrix against one row of x in one launch: the grid's first blocks_a blocks take
// part A's ma rows (type TA), the rest part B's mb rows, written after A's in y. A decode step's QKV
// projection whose V rows are kept in more bits (llama.cpp's K-quant mixes give attn_v Q6_K) is one
// kernel, not two in a row: V's small launch no longer waits for Q and K's to end. Each row is the
// sum the part's own launch makes.
template <class TA, class TB>
__device__ __forceinline__ void matvec_q8_pair(const u8* __restrict__ wa, const u8* __restrict__ wb,
                                               const Q8* __restrict__ xq, __half* __restrict__ y, int ma, int mb,
                                               int k, int blocks_a, int stage_a, int stage_b) {
    if (blockIdx.x < blocks_a)
        matvec_q8<TA, 1>(wa, xq, y, ma, k, ma + mb, stage_a, blockIdx.x);
    else
        matvec_q8<TB, 1>(wb, xq, y + ma, mb, k, ma + mb, stage_b, blockIdx.x - blocks_a);
}
// ---- a lone decode row's matvec with the small kernel after it in its epilogue (one launch, not two) ----

// SwiGLU in gate/up's matvec: act (ffn,) fp16 = silu(gate_j . x) * (up_j . x) for one row of x in 8 bits, and
// act's Q8 units (q8, ffn / 32 of them; null: none). wg, wu: the gate's and the up's (ffn, k) rows, blocks
// of type T (a stacked gate_up's halves). A block takes one Q8 unit's 32 columns, MV_ACT_COLS a warp (their
// gate and up rows together: each unit of x loaded once serves them all). Each product is the sum, in the
// order, matvec_<T>_n1 gives its row, rounded to fp16 as that kernel stores it, and the pair goes through
// silu_mul's silu_times: act's bits are those of the matvec then silu_mul.
#ifndef MV_ACT_COLS
#define MV_ACT_COLS 2  // columns a warp (a block of 32 / MV_ACT_COLS warps); engine.kernels.fused_launch says the same
#endif
constexpr int kActThreads = 32 / MV_ACT_COLS * 32;

template <class T>
__device__ __forceinline__ void matvec_act(const u8* __restrict__ wg, const u8* __restrict__ wu,
                                           const Q8* __restrict__ xq, __half* __restrict__ act, Q8* __restrict__ q8,
                                           int k) {
    constexpr int C = MV_ACT_COLS;
    __shared__ float products[32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const size_t rb = row_bytes<T>(k);
    const RowPairs<C> rows{wg, wu, rb, (int)blockIdx.x * 32 + warp * C};
    prefetch_rows_l2(rows.at(0), rb, C, min(rb, (size_t)MV_PREFETCH), lane, 32);
    prefetch_rows_l2(rows.at(C), rb, C, min(rb, (size_t)MV_PREFETCH), lane, 32);
    after_producer();
    BatchAcc<1, 2 * C> acc = {};
    rows_dot_q8_rows<T, 1, 2 * C>(rows, xq, k, acc);
#pragma unroll
    for (int c = 0; c < C; ++c) {
        const float gate = __half2float(__float2half(warp_total_rn(acc[0][c])));
        const float up = __half2float(__float2half(warp_total_rn(acc[0][C + c])));
        if (lane == 0) products[warp * C + c] = silu_times(gate, up);
    }
    __syncthreads();
    if (warp) return;
    float v[8] = {};  // lanes 0-3: eight products each, the unit's four octets (store_octet)
    if (lane < 4)
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = products[8 * lane + e];
    store_octet(act + blockIdx.x * 32 + 8 * lane, q8 ? q8 + blockIdx.x : nullptr, v, lane < 4);
}

// The residual add and RMSNorm in the epilogue of the matvec that makes their delta: delta (m,) fp16 = W x as
// matvec_<T>_n1 makes and stores it (stage as there), then the block that finishes last (counter: zero at
// rest, put back by that block) takes x (m,) fp32 += delta and out = rms_norm(x) * nw with out's Q8 units
// (q8, or null) as add_rms_norm does (add_norm.cuh: the same bits): the next matvec's input, with no kernel
// between. m % (MV_WARPS * MV_SOLO_ROWS) == 0, so that every warp has rows and reaches the block's barriers.
template <class T>
__device__ __forceinline__ void matvec_norm(const u8* __restrict__ w, const Q8* __restrict__ xq,
                                            __half* __restrict__ delta, int m, int k, int stage, float* __restrict__ x,
                                            const float* __restrict__ nw, __half* __restrict__ out,
                                            Q8* __restrict__ q8, float eps, unsigned* __restrict__ counter) {
    matvec_q8<T, 1>(w, xq, delta, m, k, m, stage);
    __threadfence();  // this block's rows of delta are seen before its count
    __syncthreads();
    __shared__ bool last;
    if (threadIdx.x == 0) last = atomicAdd(counter, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    add_norm_row<MV_WARPS * 32>(x, delta, nw, out, q8, m, eps);
    if (threadIdx.x == 0) *counter = 0u;
}
#define MATVEC_FUSED(T)                                                                                             \
    extern "C" __global__ void __launch_bounds__(kActThreads)                                                       \
        matvec_act_##T(const u8* wg, const u8* wu, const Q8* xq, __half* act, Q8* q8, int k) {                      \
        matvec_act<T>(wg, wu, xq, act, q8, k);                                                                      \
    }                                                                                                               \
    extern "C" __global__ void __launch_bounds__(MV_WARPS * 32)                                                     \
        matvec_norm_##T(const u8* w, const Q8* xq, __half* delta, int m, int k, int stage, float* x, const float* nw, \
                        __half* out, Q8* q8, float eps, unsigned* counter) {                                        \
        matvec_norm<T>(w, xq, delta, m, k, stage, x, nw, out, q8, eps, counter);                                    \
    }

#define MATVEC_PAIR(TA, TB)                                                                                         \
    extern "C" __global__ void __launch_bounds__(MV_WARPS * 32)                                                     \
        matvec2_##TA##_##TB(const u8* wa, const u8* wb, const Q8* xq, __half* y, int ma, int mb, int k,            \
                            int blocks_a, int stage_a, int stage_b) {                                               \
        matvec_q8_pair<TA, TB>(wa, wb, xq, y, ma, mb, k, blocks_a, stage_a, stage_b);                               \
    }

#define WEIGHT_KERNELS(T)                                                                                           \
    extern "C" __global__ void dequant_##T(const u8* src, __half* y, long long units, int cols) {                   \
        dequant_rows<T>(src, nullptr, y, units, cols);                                                              \
    }                                                                                                               \
    extern "C" __global__ void embed_##T(const u8* src, const long long* ids, float* y, long long units,            \
                                         int cols) {                                                                \
        dequant_rows<T>(src, ids, y, units, cols);                                                                  \
    }
#define MATVEC_Q8_NB(T, NB)                                                                                         \
    extern "C" __global__ void __launch_bounds__(MV_WARPS * 32)                                                     \
        matvec_##T##_n##NB(const u8* w, const Q8* xq, __half* y, int m, int k, int ldy, int stage) {                \
        matvec_q8<T, NB>(w, xq, y, m, k, ldy, stage);                                                               \
    }                                                                                                               \
    extern "C" __global__ void __launch_bounds__(MV_WARPS * 32)                                                     \
        matvec_##T##_n##NB##_f32(const u8* w, const Q8* xq, float* y, int m, int k, int ldy, int stage) {           \
        matvec_q8<T, NB>(w, xq, y, m, k, ldy, stage);                                                               \
    }
// Each kind's kernels in two parts (parts.cuh), so that a first start's compilations are short and many: part
// 2i holds the i-th kind's dequant/embed kernels, its pair with Q6_K (not the IQ types': no mix pairs them) and
// its matvecs of 1-8 rows, part 2i + 1 its matvecs of 9-16 rows; F16's dequant/embed kernels are in the last
// part (engine/kernels/model_parts.py mirrors this layout).
#define MATVEC_Q8_FEW(T)                                                                                            \
    WEIGHT_KERNELS(T)                                                                                               \
    MATVEC_Q8_NB(T, 1) MATVEC_Q8_NB(T, 2) MATVEC_Q8_NB(T, 3) MATVEC_Q8_NB(T, 4) MATVEC_Q8_NB(T, 5)                  \
    MATVEC_Q8_NB(T, 6) MATVEC_Q8_NB(T, 7) MATVEC_Q8_NB(T, 8) MATVEC_FUSED(T)
#define MATVEC_Q8_MANY(T)                                                                                           \
    MATVEC_Q8_NB(T, 9) MATVEC_Q8_NB(T, 10) MATVEC_Q8_NB(T, 11) MATVEC_Q8_NB(T, 12) MATVEC_Q8_NB(T, 13)              \
    MATVEC_Q8_NB(T, 14) MATVEC_Q8_NB(T, 15) MATVEC_Q8_NB(T, 16)

#if IN_PART(0)
MATVEC_Q8_FEW(Q4_0)
MATVEC_PAIR(Q4_0, Q6_K)
#endif
#if IN_PART(1)
MATVEC_Q8_MANY(Q4_0)
#endif
#if IN_PART(2)
MATVEC_Q8_FEW(Q4_1)
MATVEC_PAIR(Q4_1, Q6_K)
#endif
#if IN_PART(3)
MATVEC_Q8_MANY(Q4_1)
#endif
#if IN_PART(4)
MATVEC_Q8_FEW(Q5_0)
MATVEC_PAIR(Q5_0, Q6_K)
#endif
#if IN_PART(5)
MATVEC_Q8_MANY(Q5_0)
#endif
#if IN_PART(6)
MATVEC_Q8_FEW(Q5_1)
MATVEC_PAIR(Q5_1, Q6_K)
#endif
#if IN_PART(7)
MATVEC_Q8_MANY(Q5_1)
#endif
#if IN_PART(8)
MATVEC_Q8_FEW(Q8_0)
MATVEC_PAIR(Q8_0, Q6_K)
#endif
#if IN_PART(9)
MATVEC_Q8_MANY(Q8_0)
#endif
#if IN_PART(10)
MATVEC_Q8_FEW(Q4_K)
MATVEC_PAIR(Q4_K, Q6_K)
#endif
#if IN_PART(11)
MATVEC_Q8_MANY(Q4_K)
#endif
#if IN_PART(12)
MATVEC_Q8_FEW(Q5_K)
MATVEC_PAIR(Q5_K, Q6_K)
#endif
#if IN_PART(13)
MATVEC_Q8_MANY(Q5_K)
#endif
#if IN_PART(14)
MATVEC_Q8_FEW(Q6_K)
#endif
#if IN_PART(15)
MATVEC_Q8_MANY(Q6_K)
#endif
#if IN_PART(16)
MATVEC_Q8_FEW(IQ2_XXS)
#endif
#if IN_PART(17)
MATVEC_Q8_MANY(IQ2_XXS)
#endif
#if IN_PART(18)
MATVEC_Q8_FEW(IQ2_XS)
#endif
#if IN_PART(19)
MATVEC_Q8_MANY(IQ2_XS)
#endif
#if IN_PART(20)
MATVEC_Q8_FEW(IQ2_S)
#endif
#if IN_PART(21)
MATVEC_Q8_MANY(IQ2_S)
#endif
#if IN_PART(22)
MATVEC_Q8_FEW(IQ3_XXS)
#endif
#if IN_PART(23)
MATVEC_Q8_MANY(IQ3_XXS)
#endif
#if IN_PART(24)
MATVEC_Q8_FEW(IQ3_S)
#endif
#if IN_PART(25)
MATVEC_Q8_MANY(IQ3_S)
#endif
#if IN_PART(26)
MATVEC_Q8_FEW(IQ4_NL)
#endif
#if IN_PART(27)
MATVEC_Q8_MANY(IQ4_NL)
#endif
#if IN_PART(28)
MATVEC_Q8_FEW(IQ4_XS)
#endif
#if IN_PART(29)
MATVEC_Q8_MANY(IQ4_XS)
WEIGHT_KERNELS(F16)
#endif

// BF16 -> fp16 at load (a bf16 is the high half of an fp32). n = values.
extern "C" __global__ void dequant_BF16(const unsigned short* __restrict__ src, __half* __restrict__ y, long long n) {
    after_producer();
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = __float2half(__uint_as_float((unsigned)src[i] << 16));
}
