"""Paged attention for decode steps: one query token per sequence (Triton),
shaped for memory bandwidth (flash-decoding).

One program per (sequence, KV head, context split) reads each K/V entry of
its share of the context once and serves every query head of the KV head's
group: the group's queries form the rows of a ``tl.dot`` (padded to at least
16 rows, the tensor cores' smallest tile). The context is walked ``BLOCK_N``
tokens at a time; when ``BLOCK_N`` is a multiple of a power-of-two block
size, a tile's block table entries are read once per block, not per token.
A running (online) softmax is kept in fp32.

Splits: with ``num_splits > 1`` each program covers an equal share of its
sequence's context (rounded up to whole tiles) and writes a partial result
(running max, sum and unnormalized output); a second kernel combines the
splits of each (sequence, query head). The split count depends on shapes
only (batch, heads, block-table width, the GPU's multiprocessors), never on
the sequence lengths' values, so a launch can be captured in a CUDA graph.

Optional features, each a constexpr flag so the default kernel is compiled
without them (HF transformers' eager semantics): a sliding window (tiles
before the window's first token are never read), a logit soft cap
(``tanh(s / c) * c`` after scaling) and attention sinks (a per-head logit
that seeds the softmax: max = sink, sum = 1; added once, when the splits
are combined).

The caches may hold any KV cache format. Dots run in the query's 16-bit
dtype when every cache element converts to it exactly (the same dtype, fp8,
int8 values), else in fp32 (``input_precision="ieee"``); int8 entries are
multiplied by their bfloat16 scale, read from the two bytes after each
entry's values, after the dot (a per-token factor of the logits, and of the
probabilities before the value dot).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .jit_math import LOG2E, LOG2E_F, TL_DTYPES, tanh
from .launch_config import compute_dtype, decode_config, default_num_splits


@triton.jit
def _decode_split_kernel(  # type: ignore[no-untyped-def]  # Triton JIT: typed at launch
    q_ptr,
    key_cache_ptr,
    value_cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    sinks_ptr,
    out_ptr,
    part_ml_ptr,
    part_acc_ptr,
    qk_scale,
    window,
    softcap,
    stride_qs,
    stride_qh,
    stride_qd,
    stride_cn,
    stride_ch,
    stride_ct,
    stride_cd,
    stride_bts,
    stride_btb,
    stride_os,
    stride_oh,
    stride_od,
    QUERIES_PER_KV: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    PAGED_TILES: tl.constexpr,
    PAGES: tl.constexpr,
    COMPUTE_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    KV_INT8: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)

    offs_g = tl.arange(0, GROUP_PAD)
    mask_g = offs_g < QUERIES_PER_KV
    heads = kv_head * QUERIES_PER_KV + offs_g
    offs_d = tl.arange(0, DIM_PAD)
    mask_d = offs_d < HEAD_DIM
    mask_q = mask_g[:, None] & mask_d[None, :]
    q = tl.load(
        q_ptr + seq * stride_qs + heads[:, None] * stride_qh + offs_d[None, :] * stride_qd,
        mask=mask_q,
        other=0.0,
    ).to(COMPUTE_DTYPE)

    table_row = block_tables_ptr + seq * stride_bts
    k_base = key_cache_ptr + kv_head * stride_ch
    v_base = value_cache_ptr + kv_head * stride_ch

    if HAS_WINDOW:
        lo = tl.maximum(seq_len - window, 0)
    else:
        lo = seq_len * 0
    # Tiles start at multiples of BLOCK_N (so a tile is whole blocks); each
    # split covers a whole number of tiles of [lo, seq_len).
    first = (lo // BLOCK_N) * BLOCK_N
    tiles = tl.cdiv(seq_len - first, BLOCK_N)
    per_split = tl.cdiv(tiles, NUM_SPLITS) * BLOCK_N
    start = first + split * per_split
    end = tl.minimum(start + per_split, seq_len)

    if HAS_SINKS and NUM_SPLITS == 1:
        # The sink's logit as the running max; its exp2(0) = 1 as the sum.
        m_i = tl.load(sinks_ptr + heads, mask=mask_g, other=0.0).to(tl.float32) * LOG2E
        l_i = tl.full([GROUP_PAD], 1.0, tl.float32)
    else:
        m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
        l_i = tl.zeros([GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([GROUP_PAD, DIM_PAD], dtype=tl.float32)

    for tile in range(start, end, BLOCK_N):
        offs_n = tile + tl.arange(0, BLOCK_N)
        mask_n = (offs_n < end) & (offs_n >= lo)
        if PAGED_TILES:
            # One table entry per block of the tile, spread over its tokens.
            pages = tile // BLOCK_SIZE + tl.arange(0, PAGES)
            ids = tl.load(table_row + pages * stride_btb, mask=pages * BLOCK_SIZE < end, other=0)
            block = tl.reshape(tl.broadcast_to(ids[:, None], (PAGES, BLOCK_SIZE)), (BLOCK_N,))
        else:
            block = tl.load(table_row + (offs_n // BLOCK_SIZE) * stride_btb, mask=mask_n, other=0)
        block = block.to(tl.int64)
        offset = offs_n % BLOCK_SIZE
        mask_kv = mask_n[:, None] & mask_d[None, :]

        k_rows = k_base + block[:, None] * stride_cn + offset[:, None] * stride_ct
        k = tl.load(k_rows + offs_d[None, :] * stride_cd, mask=mask_kv, other=0.0)
        s = tl.dot(q, tl.trans(k.to(COMPUTE_DTYPE)), input_precision=DOT_PRECISION)
        if KV_INT8:
            k_entry = k_base + block * stride_cn + offset * stride_ct
            k_scale = (k_entry + HEAD_DIM * stride_cd).to(tl.pointer_type(tl.bfloat16))
            s = s * tl.load(k_scale, mask=mask_n, other=0.0).to(tl.float32)[None, :]
        s = s * qk_scale  # [GROUP_PAD, BLOCK_N]; without a soft cap in log2 units
        if HAS_SOFTCAP:  # s is the scaled logit: cap it, then to log2 units
            s = tanh(s / softcap) * (softcap * LOG2E)
        s = tl.where(mask_n[None, :], s, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)

        v_rows = v_base + block[:, None] * stride_cn + offset[:, None] * stride_ct
        v = tl.load(v_rows + offs_d[None, :] * stride_cd, mask=mask_kv, other=0.0)
        if KV_INT8:
            v_entry = v_base + block * stride_cn + offset * stride_ct
            v_scale = (v_entry + HEAD_DIM * stride_cd).to(tl.pointer_type(tl.bfloat16))
            p = p * tl.load(v_scale, mask=mask_n, other=0.0).to(tl.float32)[None, :]
        pv = tl.dot(p.to(COMPUTE_DTYPE), v.to(COMPUTE_DTYPE), input_precision=DOT_PRECISION)
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    if NUM_SPLITS == 1:
        # seq_len == 0 (not a valid input) yields zeros rather than NaN.
        out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
        tl.store(
            out_ptr + seq * stride_os + heads[:, None] * stride_oh + offs_d[None, :] * stride_od,
            out.to(out_ptr.dtype.element_ty),
            mask=mask_q,
        )
    else:
        # Partials, fp32: ml [S, Hq, NUM_SPLITS, 2] (max, sum), acc [S, Hq, NUM_SPLITS, DIM_PAD].
        row = (seq * (tl.num_programs(1) * QUERIES_PER_KV) + heads) * NUM_SPLITS + split
        tl.store(part_ml_ptr + row * 2, m_i, mask=mask_g)
        tl.store(part_ml_ptr + row * 2 + 1, l_i, mask=mask_g)
        tl.store(
            part_acc_ptr + row[:, None] * DIM_PAD + offs_d[None, :],
            acc,
            mask=mask_g[:, None],
        )


@triton.jit
def _decode_reduce_kernel(  # type: ignore[no-untyped-def]  # Triton JIT: typed at launch
    part_ml_ptr,
    part_acc_ptr,
    sinks_ptr,
    out_ptr,
    stride_os,
    stride_oh,
    stride_od,
    HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
    HAS_SINKS: tl.constexpr,
):
    """Combine the splits of one (sequence, query head): rescale each split's
    sum and output to the common max and divide."""
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    offs_s = tl.arange(0, SPLITS_PAD)
    mask_s = offs_s < NUM_SPLITS
    offs_d = tl.arange(0, DIM_PAD)
    rows = (seq * tl.num_programs(1) + head) * NUM_SPLITS + offs_s
    m = tl.load(part_ml_ptr + rows * 2, mask=mask_s, other=float("-inf"))
    l_s = tl.load(part_ml_ptr + rows * 2 + 1, mask=mask_s, other=0.0)
    acc = tl.load(
        part_acc_ptr + rows[:, None] * DIM_PAD + offs_d[None, :], mask=mask_s[:, None], other=0.0
    )
    m_max = tl.max(m, axis=0)
    if HAS_SINKS:
        sink = tl.load(sinks_ptr + head).to(tl.float32) * LOG2E
        m_max = tl.maximum(m_max, sink)
    m_safe = tl.where(m_max == float("-inf"), 0.0, m_max)
    w = tl.exp2(m - m_safe)  # empty splits: exp2(-inf) = 0
    total = tl.sum(l_s * w, axis=0)
    if HAS_SINKS:
        total += tl.exp2(sink - m_safe)
    out = tl.sum(acc * w[:, None], axis=0) / tl.where(total > 0.0, total, 1.0)
    tl.store(
        out_ptr + seq * stride_os + head * stride_oh + offs_d * stride_od,
        out.to(out_ptr.dtype.element_ty),
        mask=offs_d < HEAD_DIM,
    )


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
    block_n: int | None = None,
    num_splits: int | None = None,
) -> torch.Tensor:
    """One query token per sequence attending to its paged context.

    Args:
        query: ``[S, Hq, D]`` (Hq a multiple of Hkv: grouped-query attention;
            query head ``h`` reads KV head ``h // (Hq // Hkv)``).
        key_cache, value_cache: ``[N, Hkv, bs, E]`` of any KV cache format
            (``E = D``, or ``D + 2`` for int8 entries with their scale), of
            one layout (the same strides).
        block_tables: int32 ``[S, B]``, physical block of each logical block;
            entries past a sequence's last block are never read.
        seq_lens: int32 ``[S]``, each >= 1 (the query token is the last one).
        scale: softmax scale, usually ``D ** -0.5``.
        sliding_window: attend to the last ``sliding_window`` tokens only
            (the query's own included); None: the whole context.
        softcap: logit soft cap ``c``: scores ``tanh(s / c) * c`` after
            scaling; None: off.
        sinks: ``[Hq]`` sink logits (float32), one more softmax column per
            query head whose weight is dropped; None: off.
        block_n: context tokens per loop iteration (a power of two, >= 16);
            None: ``decode_config``'s.
        num_splits: context splits per (sequence, KV head), >= 1 (rounded up
            to a power of two); None: ``default_num_splits`` (1 on CPU).
    Returns:
        ``[S, Hq, D]`` in the query's dtype (fp32 softmax and accumulation).
    """
    num_seqs, num_heads, head_dim = query.shape
    num_kv_heads, block_size = key_cache.shape[1], key_cache.shape[2]
    assert num_heads % num_kv_heads == 0, "Hq must be a multiple of Hkv"
    kv_int8 = key_cache.dtype == torch.int8
    assert key_cache.shape[3] == head_dim + (2 if kv_int8 else 0)
    assert value_cache.shape == key_cache.shape and value_cache.stride() == key_cache.stride()
    assert block_tables.shape[0] == num_seqs and seq_lens.shape == (num_seqs,)
    compute = compute_dtype(query, key_cache.dtype)
    dim_pad = max(16, triton.next_power_of_2(head_dim))
    default_n, num_warps, num_stages, maxnreg = decode_config(compute, kv_int8, dim_pad)
    block_n = block_n or default_n
    assert block_n >= 16 and block_n & (block_n - 1) == 0, "block_n: a power of two >= 16"
    out = torch.empty_like(query)
    if num_seqs == 0:
        return out
    if sinks is not None:
        sinks = sinks.to(device=query.device, dtype=torch.float32).contiguous()
        assert sinks.shape == (num_heads,), "one sink per query head"
    if num_splits is None:
        num_splits = default_num_splits(
            num_seqs, num_kv_heads, block_tables.shape[1] * block_size, query.device
        )
    num_splits = triton.next_power_of_2(max(1, int(num_splits)))
    group = num_heads // num_kv_heads
    # Tiles of whole blocks read one table entry per block.
    paged_tiles = block_size & (block_size - 1) == 0 and block_n % block_size == 0
    if num_splits > 1:
        part_ml = torch.empty(
            num_seqs, num_heads, num_splits, 2, device=query.device, dtype=torch.float32
        )
        part_acc = torch.empty(
            num_seqs, num_heads, num_splits, dim_pad, device=query.device, dtype=torch.float32
        )
    else:
        part_ml = part_acc = out  # not written with one split
    sinks_arg = sinks if sinks is not None else out  # not read without sinks
    _decode_split_kernel[(num_seqs, num_kv_heads, num_splits)](
        query,
        key_cache,
        value_cache,
        block_tables,
        seq_lens,
        sinks_arg,
        out,
        part_ml,
        part_acc,
        float(scale) * (1.0 if softcap is not None else LOG2E_F),
        int(sliding_window or 0),
        float(softcap or 0.0),
        *query.stride(),
        *key_cache.stride(),
        *block_tables.stride(),
        *out.stride(),
        QUERIES_PER_KV=group,
        GROUP_PAD=max(16, triton.next_power_of_2(group)),
        BLOCK_SIZE=block_size,
        HEAD_DIM=head_dim,
        DIM_PAD=dim_pad,
        BLOCK_N=block_n,
        NUM_SPLITS=num_splits,
        PAGED_TILES=paged_tiles,
        PAGES=block_n // block_size if paged_tiles else 1,
        COMPUTE_DTYPE=TL_DTYPES[compute],
        DOT_PRECISION="ieee" if compute == torch.float32 else "tf32",
        HAS_WINDOW=sliding_window is not None,
        HAS_SOFTCAP=softcap is not None,
        HAS_SINKS=sinks is not None,
        KV_INT8=kv_int8,
        num_warps=num_warps,
        num_stages=num_stages,
        maxnreg=maxnreg,
    )
    if num_splits > 1:
        _decode_reduce_kernel[(num_seqs, num_heads)](
            part_ml,
            part_acc,
            sinks_arg,
            out,
            *out.stride(),
            HEAD_DIM=head_dim,
            DIM_PAD=dim_pad,
            NUM_SPLITS=num_splits,
            SPLITS_PAD=num_splits,
            HAS_SINKS=sinks is not None,
            num_warps=4,
        )
    return out
