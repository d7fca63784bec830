"""The runner: the model, its KV cache and the backend behind the loop's interface; decode and
sampling graphs, the sampler, the grammar's mask."""
