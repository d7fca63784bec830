// The CUDA names engine/kernels' sources use, defined for the host's C++ compiler (tests/engine/kernels/host_cuda.py):
// qualifiers as nothing, the thread indices as globals the runner sets, fp16 as _Float16, and the intrinsics by
// their PTX semantics. Only what thread-independent code needs: no shared memory, no barriers; a warp shuffle
// returns its own value (compiled, never relied on).
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

struct HostDim3 { unsigned x, y, z; };
HostDim3 threadIdx, blockIdx, blockDim, gridDim;
extern "C" void host_set_ids(unsigned bx, unsigned by, unsigned bz, unsigned tx, unsigned ty, unsigned tz,
                             unsigned gx, unsigned gy, unsigned gz, unsigned dx, unsigned dy, unsigned dz) {
    blockIdx = {bx, by, bz}; threadIdx = {tx, ty, tz}; gridDim = {gx, gy, gz}; blockDim = {dx, dy, dz};
}

#define __global__
#define __device__
#define __host__
#define __constant__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __align__(n) alignas(n)

typedef _Float16 __half;
struct __half2 { __half x, y; };
struct float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
struct uint2 { unsigned x, y; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }

inline float __half2float(__half h) { return (float)h; }
inline __half __float2half(float f) { return (__half)f; }
inline float2 __half22float2(__half2 h) { return {(float)h.x, (float)h.y}; }
inline __half2 __floats2half2_rn(float a, float b) { return {(__half)a, (__half)b}; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline int __float2int_rn(float f) { return (int)std::nearbyint(f); }
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {  // prmt's default mode: byte i of {y, x} by nibble i
    const unsigned long long v = ((unsigned long long)y << 32) | x;
    unsigned r = 0;
    for (int i = 0; i < 4; ++i) r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xFF) << (8 * i);
    return r;
}
inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned shift) {
    return (unsigned)((((unsigned long long)hi << 32) | lo) >> (shift & 31));
}
inline unsigned __funnelshift_l(unsigned lo, unsigned hi, unsigned shift) {
    return (unsigned)(((((unsigned long long)hi << 32) | lo) << (shift & 31)) >> 32);
}
inline unsigned bytewise(unsigned a, unsigned b, int sign) {
    unsigned r = 0;
    for (int i = 0; i < 4; ++i) r |= ((((a >> (8 * i)) & 0xFF) + sign * ((b >> (8 * i)) & 0xFF)) & 0xFF) << (8 * i);
    return r;
}
inline unsigned __vadd4(unsigned a, unsigned b) { return bytewise(a, b, 1); }
inline unsigned __vsub4(unsigned a, unsigned b) { return bytewise(a, b, -1); }
template <class T> inline T __shfl_xor_sync(unsigned, T v, int) { return v; }
template <class T> inline T __ldg(const T* p) { return *p; }
