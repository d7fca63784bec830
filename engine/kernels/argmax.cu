// The greedy pick on the device: the index of the largest logit, the first one on ties (as
// numpy.argmax), so that a decode graph ends with its token and only 8 bytes come back.
// One block: each thread scans a strided slice, then (value, index) pairs are reduced.
#include "pdl.cuh"

constexpr int ARGMAX_THREADS = 1024;

__device__ __forceinline__ void better(float& v, int& i, float v2, int i2) {
    if (v2 > v || (v2 == v && i2 < i)) v = v2, i = i2;
}

// logits: (rows, n) fp32 -> out (rows,): each row's index of its first maximum (a block a row).
extern "C" __global__ void __launch_bounds__(ARGMAX_THREADS)
argmax_first(const float* __restrict__ logits, long long* __restrict__ out, int n) {
    after_producer();
    logits += (size_t)blockIdx.x * n;
    out += blockIdx.x;
    __shared__ float sv[ARGMAX_THREADS / 32];
    __shared__ int si[ARGMAX_THREADS / 32];
    float v = -__int_as_float(0x7f800000);  // -inf
    int i = n;
    for (int j = threadIdx.x; j < n; j += ARGMAX_THREADS) better(v, i, logits[j], j);
    for (int off = 16; off > 0; off >>= 1)
        better(v, i, __shfl_xor_sync(0xffffffffu, v, off), __shfl_xor_sync(0xffffffffu, i, off));
    if ((threadIdx.x & 31) == 0) sv[threadIdx.x >> 5] = v, si[threadIdx.x >> 5] = i;
    __syncthreads();
    if (threadIdx.x >= 32) return;
    v = sv[threadIdx.x], i = si[threadIdx.x];
    for (int off = 16; off > 0; off >>= 1)
        better(v, i, __shfl_xor_sync(0xffffffffu, v, off), __shfl_xor_sync(0xffffffffu, i, off));
    if (threadIdx.x == 0) *out = i < n ? i : 0;
}
