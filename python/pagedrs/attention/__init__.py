"""Paged attention (PagedAttention §4.1): the backend interface and its
implementations (``backends``: torch reference, Rust CPU kernels, Triton), the
per-step metadata, and the transformers attention function that routes HF
models through them (``hf_attention``)."""
