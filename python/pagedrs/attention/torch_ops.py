"""Paged attention on CPU with plain torch (the reference and the CPU fast path).

Shapes (``T`` tokens in the step, ``S`` sequences, ``B`` block-table width,
``N`` physical blocks, ``Hq``/``Hkv`` query/KV heads, ``D`` head dim, ``bs``
block size):

* KV cache per layer: ``key_cache``/``value_cache`` ``[N, Hkv, bs, E]``
  (PagedAttention paper, §4.1; vLLM's layout without the x-split), ``E`` the
  entry size of the cache's format (``attention.kv_cache_dtype``: ``D``
  values, or for int8 ``D`` values and a 2-byte scale). Writes quantize into
  the format, reads dequantize from it.
* ``slot_mapping`` int64 ``[T]``: ``block * bs + offset`` of each new token.
* ``block_tables`` int32 ``[S, B]``: physical block of each logical block.
* ``seq_lens`` int32 ``[S]``: context length (cached + new tokens) per sequence.
* ``query_start_loc`` int32 ``[S + 1]``: offsets of each sequence's new tokens.

The attention functions take the options some models add, with HF
transformers' eager semantics (``masking_utils.sliding_window_overlay``,
Gemma2's and gpt-oss' ``eager_attention_forward``):

* ``sliding_window`` (tokens): the query at position ``p`` sees keys
  ``p - sliding_window < k <= p``, the last ``sliding_window`` tokens with itself.
* ``softcap``: logits become ``tanh(logits / softcap) * softcap`` after scaling,
  before the mask.
* ``sinks``: float ``[Hq]``, one logit per query head appended to each row of
  scores before the softmax; its probability is dropped, so the row's weights
  sum to less than one.

The kernels in ``pagedrs.kernels`` (Triton) compute the same functions.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .kv_cache_dtype import dequantize, quantize


def write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store new K/V ``[T, Hkv, D]`` into their slots of the paged caches
    ``[N, Hkv, bs, E]``, in place, in the caches' format (``quantize``).

    Slots < 0 are skipped (padding tokens).
    """
    block_size = key_cache.shape[2]
    if bool((slot_mapping < 0).any()):
        keep = slot_mapping >= 0
        key, value, slot_mapping = key[keep], value[keep], slot_mapping[keep]
    blocks = torch.div(slot_mapping, block_size, rounding_mode="floor")
    offsets = slot_mapping - blocks * block_size
    key_cache[blocks, :, offsets, :] = quantize(key, key_cache.dtype)
    value_cache[blocks, :, offsets, :] = quantize(value, value_cache.dtype)


def gather_kv(cache: torch.Tensor, block_tables: torch.Tensor, max_len: int) -> torch.Tensor:
    """Read the first ``max_len`` stored entries of each sequence through its
    block table.

    Args:
        cache: ``[N, Hkv, bs, E]``.
        block_tables: int ``[S, B]``.
        max_len: tokens to return per sequence (<= B * bs).
    Returns:
        ``[S, Hkv, max_len, E]`` in the cache's dtype (a copy; positions past a
        sequence's length hold whatever its padding blocks hold and must be
        masked).
    """
    num_blocks = -(-max_len // cache.shape[2])
    g = cache[block_tables[:, :num_blocks].long().clamp(min=0)]  # [S, nb, Hkv, bs, D]
    s, nb, h, bs, d = g.shape
    return g.permute(0, 2, 1, 3, 4).reshape(s, h, nb * bs, d)[:, :, :max_len]


def load_kv(
    cache: torch.Tensor, block_tables: torch.Tensor, max_len: int, dtype: torch.dtype
) -> torch.Tensor:
    """``gather_kv`` dequantized: ``[S, Hkv, max_len, D]`` in ``dtype``."""
    return dequantize(gather_kv(cache, block_tables, max_len), dtype)


def masked_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
    *,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """``softmax(scores) @ value`` with a boolean mask (True: attend).

    Without ``softcap`` and ``sinks`` this is ``scaled_dot_product_attention``;
    with either, HF's eager math in float32: ``scores = q k^T * scale``, the
    soft cap, the mask, the sink column, softmax, the sink column dropped.

    Args:
        query: ``[..., Hq, L, D]``.
        key, value: ``[..., Hkv, C, D]`` (Hq a multiple of Hkv).
        mask: bool, broadcastable to ``[..., Hq, L, C]``; every row must keep
            at least one key.
        scale: softmax scale.
        softcap: logit soft cap (> 0), or None.
        sinks: ``[Hq]`` sink logits, or None.
    Returns:
        ``[..., Hq, L, D]`` in the query's dtype.
    """
    gqa = query.shape[-3] != key.shape[-3]
    if softcap is None and sinks is None:
        return F.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, scale=scale, enable_gqa=gqa
        )
    rep = query.shape[-3] // key.shape[-3]
    k = key.float().repeat_interleave(rep, dim=-3) if gqa else key.float()
    v = value.float().repeat_interleave(rep, dim=-3) if gqa else value.float()
    scores = torch.matmul(query.float(), k.transpose(-1, -2)) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~mask, float("-inf"))
    if sinks is not None:
        sink = sinks.to(device=scores.device, dtype=torch.float32).reshape(-1, 1, 1)
        scores = torch.cat([scores, sink.expand(*scores.shape[:-1], 1)], dim=-1)
        probs = torch.softmax(scores, dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    return torch.matmul(probs, v).to(query.dtype)


def visible_mask(
    q_pos: torch.Tensor, ctx: int, seq_lens: torch.Tensor | None, sliding_window: int | None
) -> torch.Tensor:
    """Which keys each query sees: ``k <= p`` (and ``k < seq_len``), and under a
    window also ``k > p - sliding_window``.

    Args:
        q_pos: int ``[..., L]`` query positions.
        ctx: keys per context.
        seq_lens: int ``[...]`` context lengths (keys at or past are hidden),
            or None.
        sliding_window: window in tokens, or None.
    Returns:
        bool ``[..., L, ctx]``.
    """
    k_pos = torch.arange(ctx, device=q_pos.device)
    p = q_pos.long()[..., None]
    mask = k_pos <= p
    if seq_lens is not None:
        mask = mask & (k_pos < seq_lens.long()[..., None, None])
    if sliding_window is not None:
        mask = mask & (k_pos > p - sliding_window)
    return mask


def paged_decode_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    sliding_window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """One query token per sequence attending to its paged context.

    Args:
        query: ``[S, Hq, D]`` (Hq a multiple of Hkv: grouped-query attention).
        key_cache, value_cache: ``[N, Hkv, bs, E]`` of any format.
        block_tables: int32 ``[S, B]``.
        seq_lens: int32 ``[S]``, each >= 1 (the query token is the last one).
        scale: softmax scale, usually ``D ** -0.5``.
        sliding_window: attend to the last ``sliding_window`` tokens only
            (the query's own included), or None for the whole context.
        softcap: logit soft cap, or None.
        sinks: float32 ``[Hq]`` sink logits, or None.
    Returns:
        ``[S, Hq, D]`` in the query's dtype.
    """
    max_len = int(seq_lens.max())
    k = load_kv(key_cache, block_tables, max_len, query.dtype)
    v = load_kv(value_cache, block_tables, max_len, query.dtype)
    q_pos = (seq_lens.long() - 1)[:, None]  # [S, 1]
    mask = visible_mask(q_pos, max_len, None, sliding_window)  # [S, 1, max_len]
    out = masked_attention(
        query.unsqueeze(2),  # [S, Hq, 1, D]
        k,
        v,
        mask[:, None],
        scale,
        softcap=softcap,
        sinks=sinks,
    )
    return out.squeeze(2)


def causal_prefix_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scale: float,
    *,
    sliding_window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of ``L`` new tokens that come last in a context of ``C``.

    Args:
        query: ``[L, Hq, D]``.
        key, value: ``[Hkv, C, D]`` with C >= L; query i sits at position C - L + i.
        sliding_window, softcap, sinks: as ``paged_decode_attention``.
    Returns:
        ``[L, Hq, D]``.
    """
    q = query.transpose(0, 1)  # [Hq, L, D]
    q_len, ctx = q.shape[1], key.shape[1]
    plain = sliding_window is None and softcap is None and sinks is None
    if q_len == ctx and plain:
        out = F.scaled_dot_product_attention(
            q, key, value, is_causal=True, scale=scale, enable_gqa=q.shape[0] != key.shape[0]
        )
    else:
        q_pos = torch.arange(ctx - q_len, ctx, device=q.device)
        mask = visible_mask(q_pos, ctx, None, sliding_window)
        out = masked_attention(q, key, value, mask, scale, softcap=softcap, sinks=sinks)
    return out.transpose(0, 1)


def paged_prefill_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    max_query_len: int | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Variable-length causal attention over cached prefix + new tokens.

    The new tokens' K/V must already be in the cache (``write_kv``). Sequence s
    owns query rows ``query_start_loc[s]:query_start_loc[s+1]``, which are the
    last tokens of its ``seq_lens[s]``-token context.

    Args:
        query: ``[T, Hq, D]``.
        key_cache, value_cache: ``[N, Hkv, bs, E]`` of any format.
        block_tables: int32 ``[S, B]``.
        query_start_loc: int32 ``[S + 1]``.
        seq_lens: int32 ``[S]``.
        scale: softmax scale.
        max_query_len: the longest sequence's query rows, as the kernels
            take it (here each sequence runs on its own: not needed).
        sliding_window, softcap, sinks: as ``paged_decode_attention``.
    Returns:
        ``[T, Hq, D]``.
    """
    out = torch.empty_like(query)
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    for s, ctx in enumerate(lens):
        a, b = starts[s], starts[s + 1]
        if a == b:
            continue
        k = load_kv(key_cache, block_tables[s : s + 1], ctx, query.dtype)[0]
        v = load_kv(value_cache, block_tables[s : s + 1], ctx, query.dtype)[0]
        out[a:b] = causal_prefix_attention(
            query[a:b], k, v, scale, sliding_window=sliding_window, softcap=softcap, sinks=sinks
        )
    return out


def copy_blocks(
    key_caches: list[torch.Tensor], value_caches: list[torch.Tensor], block_mapping: torch.Tensor
) -> None:
    """Copy block ``src`` to ``dst`` in every layer's caches (copy-on-write).

    Args:
        key_caches, value_caches: per layer ``[N, Hkv, bs, E]`` (whole
            entries move, an int8 entry's scale with its values).
        block_mapping: int64 ``[M, 2]`` of (src, dst); destinations are distinct.
    """
    src, dst = block_mapping[:, 0], block_mapping[:, 1]
    for k, v in zip(key_caches, value_caches, strict=True):
        k[dst] = k[src]
        v[dst] = v[src]
