"""Launch geometry that several launchers share (the kernels' own constants, which the .cu files
name in their comments)."""

MATVEC_THREADS, MATVEC_ROWS = 128, 8  # a matvec block: MV_WARPS warps of MV_ROWS rows each in quant.cu
COUNTER_SEQUENCES = 64  # sequences a flash-decoding or MoE routing launch may hold (MAX_BATCH in engine/runner/runner.py)
