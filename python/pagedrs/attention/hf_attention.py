"""Paged attention as a transformers attention implementation named ``"pagedrs"``.

HF's attention modules compute Q/K/V and rotary embeddings, then call the
registered function; this one writes the new K/V into their cache slots and
attends through the block tables (PagedAttention, §4.1). The step is packed as
one sequence of ``T`` tokens (batch 1), so no padding is ever computed.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from .forward_context import get_forward_context
from .options import AttentionOptions

ATTN_IMPLEMENTATION = "pagedrs"


def paged_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention of one HF layer over the paged KV cache.

    Args:
        module: the HF attention module (its ``layer_idx`` picks the cache
            and the KV cache group's metadata).
        query: ``[1, Hq, T, D]`` after rotary embedding.
        key, value: ``[1, Hkv, T, D]`` of the step's new tokens.
        attention_mask: ignored (causality comes from the metadata).
        scaling: softmax scale (default ``D ** -0.5``); HF's attention modules
            pass their own, e.g. Gemma's ``query_pre_attn_scalar ** -0.5``.
        kwargs: what HF passes besides: ``sliding_window`` (tokens, for
            sliding-window layers; without the keyword,
            ``module.sliding_window`` when the module has one),
            ``softcap`` (attention logit soft cap) and ``s_aux`` (gpt-oss
            per-head sink logits ``[Hq]``) reach the backend; the rest is
            ignored.
    Returns:
        ``([1, T, Hq, D], None)`` as HF's attention functions do.
    Raises:
        RuntimeError: the layer is in a sliding-window KV cache group whose
            window is not the one the call attends with.
        TypeError: ``module`` has no integer ``layer_idx``.
    """
    ctx = get_forward_context()
    layer = module.layer_idx
    if not isinstance(layer, int):
        raise TypeError(f"{type(module).__name__}.layer_idx is {layer!r}, not a layer index")
    group = ctx.group_of(layer)
    key_cache, value_cache = ctx.kv_caches[layer]
    q = query[0].transpose(0, 1)  # [T, Hq, D]
    k = key[0].transpose(0, 1)  # [T, Hkv, D]
    v = value[0].transpose(0, 1)
    scale = scaling if scaling is not None else q.shape[-1] ** -0.5
    # A layer that passes no window keyword may still be a sliding one
    # (its module's ``sliding_window``, as HF's mask for it).
    if "sliding_window" in kwargs:
        window = kwargs["sliding_window"]
    else:
        window = getattr(module, "sliding_window", None)
    window = window or None
    # A sliding group holds only its window's blocks: any other window would
    # read released blocks (full attention) or differ from what was grouped.
    group_window = ctx.window_of(group)
    if group_window is not None and window != group_window:
        raise RuntimeError(
            f"layer {layer} attends with sliding_window={window}, but its KV cache "
            f"group {group} holds a sliding window of {group_window} tokens; the "
            "per-layer windows read from the config disagree with the model "
            "(disable_hybrid_kv_cache_manager=True keeps every token)"
        )
    out = ctx.backend.forward(
        q,
        k,
        v,
        key_cache,
        value_cache,
        ctx.metadata[group],
        AttentionOptions(scale, window, kwargs.get("softcap") or None, kwargs.get("s_aux")),
    )
    return out.unsqueeze(0), None


def _no_mask(*args: Any, **kwargs: Any) -> None:
    """Paged attention derives causality from the metadata; HF builds no mask."""
    return None


def register() -> None:
    """Register ``"pagedrs"`` with transformers' attention and mask interfaces."""
    AttentionInterface.register(ATTN_IMPLEMENTATION, paged_attention_forward)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, _no_mask)
