"""Launch geometry that several launchers share (the kernels' own constants, which the .cu files
name in their comments)."""
import math

THREADS = 256
MATVEC_THREADS, MATVEC_ROWS = 128, 8  # a matvec block: MV_WARPS warps of MV_ROWS rows each in quant.cu
COUNTER_SEQUENCES = 64  # sequences a flash-decoding or MoE routing launch may hold (MAX_BATCH in engine/runner/runner.py)
Q8_BYTES = 48  # one unit of an activation in 8 bits: sizeof(Q8) in q8.cuh
Q8K_BYTES = 288  # one super-block of 256 values in Q8K, sbq.cu's x: sizeof(Q8K) in q8k.cuh


def blocks(n: int, per_block: int = THREADS) -> tuple[int]:
    return (max(1, math.ceil(n / per_block)),)
