// x in Q8K, the form sbq.cu's kernels read (issue 48's super-block order): a float scale a super-block of 256 values
// and each unit of 32's integer sum. One warp a super-block, lane l its values 8l .. 8l + 7, by quantize_q8k
// (sbq.cu) or by the kernel that produced x as it stores it (norm_rope.cu's norms and SwiGLU, attention.cu's decode
// output): the same function, so the bytes are the same whoever writes them. NumPy: tools/device/sbq_check.py q8k.
#pragma once

struct Q8K {
    signed char q[256];       // round(x / d)
    signed char sums_lo[8];   // unit j's sum of q (values 32 j .. 32 j + 31) as sums_lo[j] + 128 sums_hi[j]: its low 7
    signed char sums_hi[8];   // bits (0..127) and the rest (-32..31), each a byte of an mma's fragment
    float d;                  // max |x| / 127
    int pad[3];               // 288 bytes: 16-byte loads of q
};

// A super-block's 256 values, eight a lane (f: the values as x holds them, fp16 ones), stored as out's Q8K: d = max
// |x| / 127, q = rint(x / d) (0 where d is 0). Every lane of the warp calls it (it shuffles).
__device__ __forceinline__ void store_q8k(Q8K* __restrict__ out, const float (&f)[8], int lane) {
    float amax = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(f[i]));
#pragma unroll
    for (int o = 16; o; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
    const float d = __fdiv_rn(amax, 127.f);
    unsigned words[2] = {0u, 0u};
    int s = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int q = d > 0.f ? __float2int_rn(__fdiv_rn(f[i], d)) : 0;
        s += q, words[i >> 2] |= (unsigned)(q & 0xFF) << (8 * (i & 3));
    }
    s += __shfl_xor_sync(0xFFFFFFFFu, s, 1), s += __shfl_xor_sync(0xFFFFFFFFu, s, 2);  // 4 lanes a unit
    *reinterpret_cast<uint2*>(out->q + 8 * lane) = make_uint2(words[0], words[1]);
    if ((lane & 3) == 0)
        out->sums_lo[lane >> 2] = (signed char)(s & 127), out->sums_hi[lane >> 2] = (signed char)(s >> 7);
    if (lane == 0) out->d = d;
}
