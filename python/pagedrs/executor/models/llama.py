"""Llama-family decoder (Llama, Mistral, Qwen2) on packed steps with paged
attention: ``decoder.PagedDecoderModel``'s pre-norm layers as they are
(fused QKV, rotary by table lookup, paged attention, fused gate/up, SiLU),
sliding windows (Mistral, Qwen2's ``use_sliding_window``) applied per layer.
"""

from __future__ import annotations

from .decoder import PagedDecoderModel


class PagedLlamaModel(PagedDecoderModel):
    """Llama, Mistral and Qwen2 (``decoder.PagedDecoderModel``'s arguments)."""

    model_types = ("llama", "mistral", "qwen2")
