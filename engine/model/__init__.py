"""The forward pass: the model per family over the NumPy/CuPy array operations, rope, the MoE math."""
