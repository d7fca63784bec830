"""The operations the model is written in: the NumPy reference on the CPU, CuPy and engine/kernels on the
GPU (backend.py, the one switch between them), and the mixture-of-experts' routing (moe.py)."""
