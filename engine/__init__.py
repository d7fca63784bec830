"""The Strata engine: GGUF Llama models on NumPy (CPU) or CuPy (GPU), speaking protocol/ on stdio."""
__version__ = "0.1.0"
