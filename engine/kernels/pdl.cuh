// Programmatic dependent launch (compute capability 9.0). A decode graph's kernels are captured with
// the launch attribute that lets a kernel start while the one before it is still running
// (engine/kernels/launch.py); each such kernel calls after_producer() before it reads anything the
// kernels before it wrote, or writes anything. Its blocks may run until then: a matvec streams its
// weights (which no kernel writes) into L2 while the norm or attention before it finishes, so the
// gap between two kernels is no longer a gap in the weight read. Elsewhere (a plain launch, another
// GPU) these are no-ops.
#pragma once

// Waits until every kernel this one depends on has finished and its writes are visible, then lets
// the next kernel of the stream be launched (it will wait for this one in turn: at most one kernel
// runs ahead). Every thread calls it, before any early return.
__device__ __forceinline__ void after_producer() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// The first `bytes` of each of `rows` rows (`stride` bytes apart) from p into L2, a 128-byte line at a
// time: thread t of `threads` (a warp's lanes, or a block's threads) takes lines t, t + threads, ...
__device__ __forceinline__ void prefetch_rows_l2(const void* p, size_t stride, int rows, size_t bytes, int t,
                                                 int threads) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const char* c = static_cast<const char*>(p);
    const size_t lines = (bytes + 127) / 128;
    for (size_t i = t; i < rows * lines; i += threads)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(c + (i / lines) * stride + (i % lines) * 128));
#endif
}
