// Matrix-vector products for single rows (the output head of the last prompt position; decode
// steps build on this family). NumPy reference: ArrayOps.logits.
#include <cuda_fp16.h>

constexpr int MATVEC_WARPS = 8;  // rows per block: one warp a row

__device__ __forceinline__ void store(float* y, int i, float v) { y[i] = v; }
__device__ __forceinline__ void store(__half* y, int i, float v) { y[i] = __float2half(v); }

// y: (m,) = W: (m, k) fp16 row-major @ x: (k,) fp16; fp32 accumulation, 16-byte loads; y fp32
// (logits) or fp16 (a decode step's projections: cuBLAS cannot be captured in a graph by CuPy).
// Requires k % 8 == 0 (every model width is).
template <typename T>
__device__ __forceinline__ void matvec(const __half* __restrict__ w, const __half* __restrict__ x, T* __restrict__ y,
                                       int m, int k) {
    const int row = blockIdx.x * MATVEC_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= m) return;
    const uint4* wr = reinterpret_cast<const uint4*>(w + (size_t)row * k);
    const uint4* xv = reinterpret_cast<const uint4*>(x);
    float acc = 0.f;
    for (int c = lane; c < k / 8; c += 32) {
        const uint4 a = wr[c], b = xv[c];
        const __half2* ha = reinterpret_cast<const __half2*>(&a);
        const __half2* hb = reinterpret_cast<const __half2*>(&b);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float2 fa = __half22float2(ha[i]), fb = __half22float2(hb[i]);
            acc += fa.x * fb.x + fa.y * fb.y;
        }
    }
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) store(y, row, acc);
}

extern "C" __global__ void __launch_bounds__(MATVEC_WARPS * 32)
matvec_f16(const __half* w, const __half* x, float* y, int m, int k) { matvec(w, x, y, m, k); }

extern "C" __global__ void __launch_bounds__(MATVEC_WARPS * 32)
matvec_f16_h(const __half* w, const __half* x, __half* y, int m, int k) { matvec(w, x, y, m, k); }
