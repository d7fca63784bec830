"""KV memory: the block pool and prefix cache, the KV arrays, the host tier, how large it all is."""
