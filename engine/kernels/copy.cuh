// Shared-memory addresses and asynchronous global -> shared copies (cp.async), for the kernels that
// stage tiles: mma.cuh's users, stage.cuh and attention_sm90.cu. No CUDA header (the sm_90a build has none).
#pragma once

using uint32_t = unsigned int;  // NVRTC has no <stdint.h>

// (Without __CUDA_ARCH__: the CPU's tests run these files on the host, tests/engine/kernels/cuda_host.h, whose
// host_* forms copy at once.)
__device__ __forceinline__ unsigned smem_addr(const void* p) {
#ifdef __CUDA_ARCH__
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
#else
    return host_smem_addr(p);
#endif
}

// 16 bytes global -> shared (a shared-space address) without passing through registers; zero-filled
// when !valid.
__device__ __forceinline__ void cp_async16_to(unsigned dst, const void* src, bool valid) {
#ifdef __CUDA_ARCH__
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
#else
    host_copy16(dst, src, valid);
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#ifdef __CUDA_ARCH__
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}

template <int N>
__device__ __forceinline__ void cp_async_wait() {
#ifdef __CUDA_ARCH__
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}
