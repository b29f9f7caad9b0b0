"""Tensor parallelism (PagedAttention paper §4.6): one scheduler, N workers."""
