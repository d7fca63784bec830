"""The model: its weights read from a GGUF onto a backend (weights.py), the forward pass per family over
engine/ops (forward.py), RoPE's frequencies (rope.py)."""
