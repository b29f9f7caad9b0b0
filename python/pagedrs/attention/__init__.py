"""Paged attention backend: torch path (CPU) and Triton kernels (GPU)."""
