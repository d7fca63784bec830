// SwiGLU's product silu(gate) * up of one value pair, as every kernel that makes it rounds it: the gate
// and up values as fp16 holds them (the matvec's stored output), the product in fp32. norm_rope.cu's
// silu_mul and quant.cu's matvec_act (gate/up's matvec with the product in its epilogue) share it, so
// that a decode row fused or not gives the same bits.
#pragma once
#include <cuda_fp16.h>

__device__ __forceinline__ float silu_times(float gate, float up) { return gate / (1.f + __expf(-gate)) * up; }
