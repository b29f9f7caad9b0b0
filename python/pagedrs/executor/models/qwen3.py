"""Qwen3 on packed steps with paged attention: the Llama layer with an
RMSNorm over each query and key head (HF's ``q_norm`` / ``k_norm``, one
weight per head dim shared by the heads) before rotary embedding, run over
the fused q/k heads at once (``ops.heads_norm``)."""

from __future__ import annotations

from typing import Any

from torch import nn

from .decoder import DecoderLayer, PagedDecoderModel
from .ops import heads_norm


class PagedQwen3Model(PagedDecoderModel):
    """Qwen3 (``decoder.PagedDecoderModel``'s arguments)."""

    model_types = ("qwen3",)

    def make_layer(self, index: int, hf_layer: nn.Module, batch_invariant: bool) -> DecoderLayer:
        layer = super().make_layer(index, hf_layer, batch_invariant)
        attn: Any = hf_layer.self_attn
        layer.qk_norm = heads_norm(
            attn.q_norm, attn.k_norm, self.num_heads, self.num_kv_heads, self.norm_offset
        )
        return layer
