// Hopper's warpgroup MMA (wgmma, sm_90a) from PTX, for attention_sm90.cu: operand descriptors of
// shared-memory tiles in the 128-byte swizzled layout, the fences and the MMAs it issues. The
// accumulator layout of an m64nN wgmma is, for each warp of the warpgroup (16 rows each), the
// mma.sync m16n8 C layout repeated over N/8 column tiles: thread lane holds, for tile i,
// d[4i + e] at row (lane / 4) + 8 (e / 2), column 8i + 2 (lane % 4) + e % 2; a register A operand
// is the mma.sync m16n8k16 A fragment of the warp's 16 rows.
//
// No CUDA header: this file is compiled by engine/kernels/sm90.py through NVRTC for sm_90a alone.
#pragma once

#include "copy.cuh"

using uint64_t = unsigned long long;

constexpr int SW_ROW = 128;  // bytes in a swizzled row: 64 fp16 values; 8 rows (1024 bytes) make an atom

// The byte offset of 16-byte chunk `chunk` (8 fp16 values) of row r in a tile of `rows` rows whose rows
// are split into panels of 64 values (one after the other, each rows x 128 bytes, 1024-aligned) with
// the 128-byte swizzle: chunk c of a row lands at c ^ (row % 8).
__device__ __forceinline__ unsigned sw128(int r, int chunk, int rows) {
    return (chunk >> 3) * rows * SW_ROW + r * SW_ROW + (((chunk & 7) ^ (r & 7)) << 4);
}

// A shared-memory operand in the 128-byte swizzle: start address, leading and stride byte offsets.
// K-major (rows of the operand contiguous along K): lbo unused, sbo = 1024 (the next 8 rows).
// N-major (B's rows, the K index, each a row of memory): lbo = the next 64-value panel along N,
// sbo = 1024 (the next 8 K rows).
__device__ __forceinline__ uint64_t sw128_desc(unsigned addr, unsigned lbo, unsigned sbo) {
    return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(sbo >> 4) << 32) |
           (1ull << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
// shared memory written by ordinary stores or cp.async, read next by the tensor cores (async proxy)
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// keeps the compiler from moving reads of accumulators above the wait that completes them
template <int N>
__device__ __forceinline__ void fence_regs(float* r) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
// ... and keeps registers a wgmma reads (its A operand) from being reused before the wait
template <int N>
__device__ __forceinline__ void fence_regs(uint32_t* r) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

// The accumulators of an m64nN wgmma as asm operands: N / 2 fp32 registers a thread, d[0] .. d[N/2 - 1],
// named %0 .. %(N/2 - 1) in the instruction.
#define WG_ACC8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
    "+f"(d[i + 6]), "+f"(d[i + 7])
#define WG_ACC32 WG_ACC8(0), WG_ACC8(8), WG_ACC8(16), WG_ACC8(24)
#define WG_ACC64 WG_ACC32, WG_ACC8(32), WG_ACC8(40), WG_ACC8(48), WG_ACC8(56)
#define WG_D32 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define WG_D64 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
// scale-d as the predicate p (0: d = A B, 1: d += A B), from the operand after the others
#define WG_SCALE_D(n) "{\n.reg .pred p;\nsetp.ne.b32 p, %" #n ", 0;\n"

// d (64 x 128) (+)= A (64 x 16, shared memory, K-major) * B (16 x 128, shared memory, K-major)
__device__ __forceinline__ void wgmma_ss_n128(float* d, uint64_t a, uint64_t b, int scale_d) {
    asm volatile(WG_SCALE_D(66) "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " WG_D64
                 ", %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : WG_ACC64
                 : "l"(a), "l"(b), "r"(scale_d));
}

// d (64 x N) (+)= A (64 x 16, registers) * B (16 x N, shared memory, N-major), N = 64 and 128
__device__ __forceinline__ void wgmma_rs_n64_t(float* d, const uint32_t* a, uint64_t b, int scale_d) {
    asm volatile(WG_SCALE_D(37) "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " WG_D32
                 ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                 : WG_ACC32
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));
}

__device__ __forceinline__ void wgmma_rs_n128_t(float* d, const uint32_t* a, uint64_t b, int scale_d) {
    asm volatile(WG_SCALE_D(69) "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " WG_D64
                 ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                 : WG_ACC64
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));
}
