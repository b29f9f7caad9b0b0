"""pagedrs' own model code for the families it runs natively (fused projections,
packed steps, paged attention called directly); other models run HF's modules."""

from .llama import PagedLlamaModel, supports_native

__all__ = ["PagedLlamaModel", "supports_native"]
