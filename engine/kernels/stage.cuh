// Bulk copies from global to shared memory (compute capability 9.0: cp.async.bulk, the copy engine
// TMA drives, completing on an mbarrier). One thread asks for a whole run of bytes with one
// instruction; the bytes arrive while the SM does other work, and any number of warps' runs are in
// flight at once, and it may be issued before a kernel waits for its producer. The quantized matvecs
// stage the rows of small matrices this way (quant.cu, engine.kernels.matvec_stage): a lane issuing its
// own loads keeps a few hundred bytes in flight, a bulk copy a whole row.
// Elsewhere (no sm_90) STAGE_BULK is 0 and the kernels read global memory as before.
#pragma once
#include "copy.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define STAGE_BULK 1
#else
#define STAGE_BULK 0
#endif

// Thread-alone: arms `bar` (one arrival, `bytes` of transactions) and copies bytes from src to dst,
// both 16-byte aligned, bytes a multiple of 16 (below 1 MiB: an mbarrier's transaction count).
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, unsigned bytes, unsigned long long* bar) {
#if STAGE_BULK
    const unsigned b = smem_addr(bar);
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(b) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");  // the init, seen by the copy engine
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b), "r"(bytes) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"(smem_addr(dst)), "l"(src), "r"(bytes), "r"(b) : "memory");
#endif
}

// Every thread that reads the copy waits here (phase 0: each barrier is armed once per launch).
__device__ __forceinline__ void bulk_wait(unsigned long long* bar) {
#if STAGE_BULK
    const unsigned b = smem_addr(bar);
    unsigned done = 0;
    while (!done)
        asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0;\n selp.u32 %0, 1, 0, p;\n}"
                     : "=r"(done) : "r"(b) : "memory");
#endif
}
