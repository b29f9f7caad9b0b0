"""Gemma, Gemma 2 and Gemma 3 (text) on packed steps with paged attention.

What differs from the Llama layer (``decoder``), each as HF's Gemma modules
compute it:

- embeddings scaled by ``sqrt(hidden)`` (HF's scaled embedding module, or
  ``QuantizedEmbedding``'s ``embed_scale``: the model's own module runs);
- RMSNorm with ``1 + weight`` (``ops.RMSNorm(offset=True)``);
- the gate activation GELU with tanh (``hidden_activation``);
- Gemma 2 / 3: a norm after attention and one after the MLP, on their
  outputs before the residual add (and one before the MLP);
- the attention scale ``query_pre_attn_scalar ** -0.5`` (HF's ``scaling``);
- Gemma 2: attention logits soft-capped (``attn_logit_softcapping``,
  ``AttentionOptions.softcap``); HF's Gemma 3 passes no cap to attention,
  nor does this;
- Gemma 2 / 3: sliding-window layers beside global ones
  (``config.layer_types``), each attending with its window through its KV
  cache group's metadata;
- Gemma 3: q/k RMSNorm per head before rotary, and a rotary table per layer
  type (local layers' ``rope_local_base_freq``, global layers' theta and
  scaling; HF's ``rope_parameters[layer_type]``).

The final logit soft cap (``final_logit_softcapping``) is applied by the
runner after the LM head (``model_support.logits_transform``), as for HF's
modules.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ...attention.options import AttentionOptions
from .decoder import DecoderLayer, LayerStep, PagedDecoderModel
from .ops import heads_norm, norm_of


class GemmaLayer(DecoderLayer):
    """A Gemma layer: ``post_norm`` is the norm after attention (Gemma 2 /
    3; Gemma's norm before the MLP), ``pre_ff_norm`` / ``post_ff_norm`` the
    norms around the MLP (None for Gemma)."""

    def __init__(self, hf_layer: nn.Module, batch_invariant: bool) -> None:
        super().__init__(hf_layer, batch_invariant, offset=True)
        pre = getattr(hf_layer, "pre_feedforward_layernorm", None)
        post = getattr(hf_layer, "post_feedforward_layernorm", None)
        self.pre_ff_norm = None if pre is None else norm_of(pre, offset=True)
        self.post_ff_norm = None if post is None else norm_of(post, offset=True)


class PagedGemmaModel(PagedDecoderModel):
    """Gemma, Gemma 2 and Gemma 3 text models (``decoder.PagedDecoderModel``'s
    arguments)."""

    model_types = ("gemma", "gemma2", "gemma3_text")
    norm_offset = True

    @classmethod
    def supports_config(cls, config: Any) -> bool:
        """Causal attention only (not the bidirectional embedding variant)."""
        return not getattr(config, "use_bidirectional_attention", False)

    def make_layer(self, index: int, hf_layer: nn.Module, batch_invariant: bool) -> DecoderLayer:
        layer = GemmaLayer(hf_layer, batch_invariant)
        attn: Any = hf_layer.self_attn
        if (layer.pre_ff_norm is None) != (layer.post_ff_norm is None):
            raise ValueError(f"layer {index}: a feed-forward pre-norm without a post-norm")
        softcap = None
        if self.config.model_type == "gemma2":
            softcap = getattr(attn, "attn_logit_softcapping", None) or None
        layer.attention = AttentionOptions(float(attn.scaling), None, softcap)
        if hasattr(attn, "q_norm"):
            layer.qk_norm = heads_norm(
                attn.q_norm, attn.k_norm, self.num_heads, self.num_kv_heads, offset=True
            )
        types = self._rope_layer_types()
        if types:
            layer.rope = types.index(self.config.layer_types[index])
        return layer

    def _rope_layer_types(self) -> list[str]:
        """Gemma 3's layer types with a rotary table each (HF's rotary module
        takes the type); empty for one table."""
        if self.config.model_type != "gemma3_text":
            return []
        return sorted(set(self.config.layer_types))

    def rotary_args(self) -> list[tuple[str, ...]]:
        types = self._rope_layer_types()
        return [(t,) for t in types] if types else [()]

    def layer_forward(self, layer: DecoderLayer, x: torch.Tensor, step: LayerStep) -> torch.Tensor:
        """Gemma 2 / 3: ``x + post_norm(o(attn(norm(x))))``, then
        ``+ post_ff_norm(down(act(gate) * up))`` of ``pre_ff_norm``; Gemma:
        Llama's residuals."""
        assert isinstance(layer, GemmaLayer)
        if layer.pre_ff_norm is None or layer.post_ff_norm is None:
            return super().layer_forward(layer, x, step)
        attn = self.attend(layer, layer.input_norm(x), step)
        x = x + layer.post_norm(layer.o_proj(attn))
        gate, up = layer.gate_up(layer.pre_ff_norm(x)).chunk(2, dim=-1)
        return x + layer.post_ff_norm(layer.down_proj(layer.act(gate).mul_(up)))
