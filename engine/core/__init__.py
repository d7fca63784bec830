"""The bottom layer: what every other layer of the engine shares (the step's metadata, the quantized
block types, the KV cache's element types, the host's memory, a process that ends with its parent)."""
