"""Model executor layer: model loading, KV cache tensors, forward pass, sampling."""
