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

from . import torch_ops
from .forward_context import get_forward_context

ATTN_IMPLEMENTATION = "pagedrs"


def _ops(use_triton: bool) -> Any:
    if use_triton:
        from .. import kernels

        return kernels
    return torch_ops


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
    """Attention of one layer over the paged KV cache.

    Args:
        module: the HF attention module (its ``layer_idx`` picks the cache).
        query: ``[1, Hq, T, D]`` after rotary embedding.
        key, value: ``[1, Hkv, T, D]`` of the step's new tokens.
        attention_mask: ignored (causality comes from the metadata).
        scaling: softmax scale (default ``D ** -0.5``).
    Returns:
        ``([1, T, Hq, D], None)`` as HF's attention functions do.
    """
    ctx = get_forward_context()
    meta = ctx.metadata
    ops = _ops(ctx.use_triton)
    key_cache, value_cache = ctx.kv_caches[module.layer_idx]
    q = query[0].transpose(0, 1)  # [T, Hq, D]
    k = key[0].transpose(0, 1)  # [T, Hkv, D]
    v = value[0].transpose(0, 1)
    scale = scaling if scaling is not None else q.shape[-1] ** -0.5
    ops.write_kv(k, v, key_cache, value_cache, meta.slot_mapping)

    if meta.all_decode:
        out = ops.paged_decode_attention(
            q, key_cache, value_cache, meta.block_tables, meta.seq_lens, scale
        )
        return out.unsqueeze(0), None

    if ctx.use_triton:
        # One launch for the whole mixed batch: a decode is a 1-token prefill.
        out = ops.paged_prefill_attention(
            q,
            key_cache,
            value_cache,
            meta.block_tables,
            meta.query_start_loc,
            meta.seq_lens,
            scale,
            max_query_len=meta.max_query_len,
        )
        return out.unsqueeze(0), None

    out = torch.empty_like(q)
    if meta.decode_seqs.numel():
        d = meta.decode_seqs
        out[meta.decode_tokens] = torch_ops.paged_decode_attention(
            q[meta.decode_tokens],
            key_cache,
            value_cache,
            meta.block_tables[d],
            meta.seq_lens[d],
            scale,
        )
    for seq, start, end, seq_len in meta.prefills:
        if seq_len == end - start:
            # Whole prompt in this step: attend to the fresh K/V, no gather.
            k_seq, v_seq = k[start:end].transpose(0, 1), v[start:end].transpose(0, 1)
        else:
            k_seq = torch_ops.gather_kv(key_cache, meta.block_tables[seq : seq + 1], seq_len)[0]
            v_seq = torch_ops.gather_kv(value_cache, meta.block_tables[seq : seq + 1], seq_len)[0]
        out[start:end] = torch_ops.causal_prefix_attention(q[start:end], k_seq, v_seq, scale)
    return out.unsqueeze(0), None


def _no_mask(*args: Any, **kwargs: Any) -> None:
    """Paged attention derives causality from the metadata; HF builds no mask."""
    return None


def register() -> None:
    """Register ``"pagedrs"`` with transformers' attention and mask interfaces."""
    AttentionInterface.register(ATTN_IMPLEMENTATION, paged_attention_forward)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, _no_mask)
