"""Phi-3 on packed steps with paged attention: the Llama layer on the
checkpoint's own fused ``qkv_proj`` and ``gate_up_proj`` (taken as they
are: one projection each, gate rows first), partial rotary embedding where
``partial_rotary_factor`` < 1 (the channels past the rotated ones pass
unchanged, ``ops.RotaryTable``) and the config's sliding window on every
layer, as HF's ``Phi3Attention`` passes it. Long-context RoPE (``longrope``,
the ``su`` scaling of the 128k files) depends on the sequence length and is
refused by name at load (``model_support``), never run here.
"""

from __future__ import annotations

from .decoder import PagedDecoderModel


class PagedPhi3Model(PagedDecoderModel):
    """Phi-3 (``decoder.PagedDecoderModel``'s arguments)."""

    model_types = ("phi3",)
