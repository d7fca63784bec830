// Tensor-core and async-copy helpers (PTX) shared by the kernels that run mma.sync: the
// attention (attention.cu) and the experts' grouped GEMM (moe.cu).
#pragma once
#include <cuda_fp16.h>

#include "copy.cuh"

// (Without __CUDA_ARCH__: the CPU's tests run these on the host, tests/engine/kernels/cuda_host.h, the warp's
// fragments gathered as PTX lays them out.)
__device__ __forceinline__ void mma_16x8x16(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
#ifdef __CUDA_ARCH__
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    host_mma_f16(c, a, b0, b1);
#endif
}

__device__ __forceinline__ uint32_t ld32(const __half* p) { return *reinterpret_cast<const uint32_t*>(p); }

__device__ __forceinline__ void cp_async16(__half* dst, const __half* src, bool valid) {
    cp_async16_to(smem_addr(dst), src, valid);
}

// Four 8x8 fp16 matrices from shared memory, in mma fragment layout (lanes 8i..8i+7 give the
// row addresses of matrix i); .trans hands each thread the transposed elements.
__device__ __forceinline__ void ldmatrix_x4(uint32_t* r, const __half* p) {
#ifdef __CUDA_ARCH__
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
#else
    host_ldmatrix_x4(r, p, false);
#endif
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t* r, const __half* p) {
#ifdef __CUDA_ARCH__
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
#else
    host_ldmatrix_x4(r, p, true);
#endif
}
