"""One layer's paged attention over a step: write the new K/V, then attend.

Picks the implementation per step: Triton kernels (GPU), the Rust CPU kernels
(float32 on CPU: decode reads K/V in place through the block tables), or the
torch reference path. Shapes as in ``torch_ops``.
"""

from __future__ import annotations

from types import ModuleType

import torch

from . import cpu_kernels, torch_ops
from .metadata import AttentionMetadata


def _ops(backend: str, cache: torch.Tensor) -> ModuleType:
    if backend == "triton":
        from .. import kernels

        return kernels
    if backend == "cpu" and cpu_kernels.supports(cache):
        return cpu_kernels
    return torch_ops


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    backend: str,
) -> torch.Tensor:
    """PagedAttention (§4.1) of a packed step of ``T`` tokens.

    Stores ``k``/``v`` at ``meta.slot_mapping``, then each sequence's new tokens
    attend causally to its whole context (cached prefix + new tokens).

    Args:
        q: ``[T, Hq, D]`` after rotary embedding.
        k, v: ``[T, Hkv, D]`` of the step's new tokens.
        key_cache, value_cache: this layer's ``[N, Hkv, bs, D]`` caches.
        meta: the step's metadata.
        scale: softmax scale.
        backend: "triton" (GPU kernels), "cpu" (the Rust kernels where they
            apply, float32 on CPU; else the torch path) or "torch" (the plain
            torch reference, which gathers each context into a padded copy).
    Returns:
        ``[T, Hq, D]`` in the query's dtype.
    """
    ops = _ops(backend, key_cache)
    ops.write_kv(k, v, key_cache, value_cache, meta.slot_mapping)

    if meta.all_decode:
        return ops.paged_decode_attention(
            q, key_cache, value_cache, meta.block_tables, meta.seq_lens, scale
        )

    if backend == "triton":
        # One launch for the whole mixed batch: a decode is a 1-token prefill.
        return ops.paged_prefill_attention(
            q,
            key_cache,
            value_cache,
            meta.block_tables,
            meta.query_start_loc,
            meta.seq_lens,
            scale,
            max_query_len=meta.max_query_len,
        )

    out = torch.empty_like(q)
    if meta.decode_seqs.numel():
        d = meta.decode_seqs
        out[meta.decode_tokens] = ops.paged_decode_attention(
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
        out[start:end] = torch_ops.causal_prefix_attention(
            q[start:end], k_seq.to(q.dtype), v_seq.to(q.dtype), scale
        )
    return out
