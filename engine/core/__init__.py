"""The bottom layer: what every other layer of the engine shares (the step's metadata, the quantized
block types, the KV cache's element types, a process that ends with its parent)."""
