// FlashAttention's running softmax over one tile of scores held in the tensor cores' accumulator
// layout (mma.sync m16n8, or a wgmma m64nN per warp, which repeats it): a thread holds two rows,
// a (fragment row lane / 4) and b (8 rows on), s[4i + e] being row a's (e < 2) or row b's score of
// key k0 + 8i + 2 (lane % 4) + e % 2. Shared by attention.cu and attention_sm90.cu. No CUDA header.
#pragma once

#define NEG_INF (-__int_as_float(0x7f800000))  // -inf (NVRTC has no <math.h> INFINITY)

struct RowState {  // a query row's running max (log2 domain) and sum of exp2(score - max)
    float m = NEG_INF, l = 0.f;
};

// Scales a tile's scores s (KEYS / 2 a thread) into the log2 domain, masks keys past a row's
// position or key_end (only when `masked`: a tile that reaches the diagonal or the end), folds the
// tile into the rows' running max and sum, and leaves exp2(s - max) in s. The rows' output so far
// must then be multiplied by corr_a (row a) and corr_b (row b).
template <int KEYS>
__device__ __forceinline__ void online_softmax(float* s, RowState& a, RowState& b, int k0, bool masked, int pos_a,
                                               int pos_b, int key_end, float scale_log2, float& corr_a,
                                               float& corr_b) {
    const int t = threadIdx.x & 3;
    float tmax_a = NEG_INF, tmax_b = NEG_INF;
#pragma unroll
    for (int i = 0; i < KEYS / 8; ++i) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int key = k0 + 8 * i + 2 * t + e;
            s[4 * i + e] = !masked || (key <= pos_a && key < key_end) ? s[4 * i + e] * scale_log2 : NEG_INF;
            s[4 * i + 2 + e] = !masked || (key <= pos_b && key < key_end) ? s[4 * i + 2 + e] * scale_log2 : NEG_INF;
            tmax_a = fmaxf(tmax_a, s[4 * i + e]);
            tmax_b = fmaxf(tmax_b, s[4 * i + 2 + e]);
        }
    }
    // a row's scores are spread over the 4 threads of a quad
    tmax_a = fmaxf(tmax_a, __shfl_xor_sync(0xffffffffu, tmax_a, 1));
    tmax_a = fmaxf(tmax_a, __shfl_xor_sync(0xffffffffu, tmax_a, 2));
    tmax_b = fmaxf(tmax_b, __shfl_xor_sync(0xffffffffu, tmax_b, 1));
    tmax_b = fmaxf(tmax_b, __shfl_xor_sync(0xffffffffu, tmax_b, 2));
    const float new_a = fmaxf(a.m, tmax_a), new_b = fmaxf(b.m, tmax_b);
    // a row with no visible key yet keeps max -inf: use 0 so exp2 gives 0, not NaN
    const float base_a = new_a == NEG_INF ? 0.f : new_a, base_b = new_b == NEG_INF ? 0.f : new_b;
    corr_a = exp2f(a.m - base_a);
    corr_b = exp2f(b.m - base_b);
    a.m = new_a;
    b.m = new_b;
    a.l *= corr_a;
    b.l *= corr_b;
#pragma unroll
    for (int i = 0; i < KEYS / 8; ++i) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            s[4 * i + e] = exp2f(s[4 * i + e] - base_a);
            s[4 * i + 2 + e] = exp2f(s[4 * i + 2 + e] - base_b);
            a.l += s[4 * i + e];
            b.l += s[4 * i + 2 + e];
        }
    }
}

// The rows' output so far (o: N accumulators a thread, in the layout above) by online_softmax's factors.
template <int N>
__device__ __forceinline__ void rescale(float* o, float corr_a, float corr_b) {
#pragma unroll
    for (int i = 0; i < N / 4; ++i) {
        o[4 * i] *= corr_a;
        o[4 * i + 1] *= corr_a;
        o[4 * i + 2] *= corr_b;
        o[4 * i + 3] *= corr_b;
    }
}

// Two fp32 values as one register of two fp16 (lo in the low half), rounded to nearest.
__device__ __forceinline__ unsigned pack_f16x2(float lo, float hi) {
#ifdef __CUDA_ARCH__
    unsigned r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
#else  // the CPU's tests (tests/engine/kernels/cuda_host.h)
    const __half2 h = __floats2half2_rn(lo, hi);
    unsigned r;
    memcpy(&r, &h, 4);
    return r;
#endif
}

// The probabilities of keys 16kk .. 16kk + 15 of a tile (p: online_softmax's s) as the A fragment
// of an m16n8k16 MMA (a wgmma's register A operand, per warp): P V's next k-step.
__device__ __forceinline__ void p_fragment(const float* p, int kk, unsigned* a) {
    a[0] = pack_f16x2(p[8 * kk + 0], p[8 * kk + 1]);
    a[1] = pack_f16x2(p[8 * kk + 2], p[8 * kk + 3]);
    a[2] = pack_f16x2(p[8 * kk + 4], p[8 * kk + 5]);
    a[3] = pack_f16x2(p[8 * kk + 6], p[8 * kk + 7]);
}

// The rows' sums over their quads, then the reciprocals that normalize their output.
__device__ __forceinline__ void row_sums(RowState& a, RowState& b, float& inv_a, float& inv_b) {
    a.l += __shfl_xor_sync(0xffffffffu, a.l, 1);
    a.l += __shfl_xor_sync(0xffffffffu, a.l, 2);
    b.l += __shfl_xor_sync(0xffffffffu, b.l, 1);
    b.l += __shfl_xor_sync(0xffffffffu, b.l, 2);
    inv_a = 1.f / a.l;
    inv_b = 1.f / b.l;
}
