"""The model file: GGUF reading, the model's configuration and weights, its tokenizer and chat
template, where a model is found. What serve/ may import without reaching into the engine."""
