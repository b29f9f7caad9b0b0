"""Paged attention on CPU through the Rust kernels of ``pagedrs._core``.

The torch path (``torch_ops``) gathers every sequence's context into a padded
copy before attending; these kernels read keys and values in place through the
block tables (PagedAttention §4.1), in parallel over sequences, so a decode
step costs one pass over the context actually held, whatever the longest
sequence. They take float32 CPU tensors; ``supports`` tells when they apply.
Shapes as in ``torch_ops``.
"""

from __future__ import annotations

import torch

from .. import _core


def supports(cache: torch.Tensor) -> bool:
    """Whether the Rust kernels handle this KV cache (float32, CPU)."""
    return cache.device.type == "cpu" and cache.dtype == torch.float32


def paged_decode_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One query token per sequence attending to its whole paged context.

    Args:
        query: float32 ``[S, Hq, D]`` (Hq a multiple of Hkv).
        key_cache, value_cache: float32 ``[N, Hkv, bs, D]``, contiguous.
        block_tables: int32 ``[S, B]``.
        seq_lens: int32 ``[S]``, each >= 1 (the query's token is already cached).
        scale: softmax scale.
    Returns:
        float32 ``[S, Hq, D]``.
    Raises:
        ValueError: inconsistent shapes or a block id outside the cache.
    """
    q = query.contiguous()
    out = torch.empty_like(q)
    _core.paged_decode_attention(
        q.numpy(),
        key_cache.numpy(),
        value_cache.numpy(),
        block_tables.to(torch.int32).contiguous().numpy(),
        seq_lens.to(torch.int32).contiguous().numpy(),
        float(scale),
        out.numpy(),
        torch.get_num_threads(),
    )
    return out


def write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store new K/V ``[T, Hkv, D]`` into their slots of the paged caches, in place.

    Slots < 0 are skipped (padding tokens).

    Raises:
        ValueError: inconsistent shapes or a slot outside the cache.
    """
    _core.write_kv(
        key.float().contiguous().numpy(),
        value.float().contiguous().numpy(),
        key_cache.numpy(),
        value_cache.numpy(),
        slot_mapping.to(torch.int64).contiguous().numpy(),
    )
