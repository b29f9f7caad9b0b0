"""Variable-length causal paged attention for prefill steps (Triton).

One program per (sequence, query head, tile of ``BLOCK_M`` new tokens) walks the
keys ``BLOCK_N`` at a time up to the tile's causal limit, reading each key's
physical slot through the block table, with an online softmax in fp32 (the
FlashAttention-2 scheme on a paged cache). The context may start with a cached
prefix: the new tokens are the last ones of each sequence's context.

As in the decode kernel, a sliding window, a logit soft cap and attention sinks
are constexpr flags, off in the default kernel; under a window each tile's key
loop starts at its first row's first visible key. Caches of any KV cache
format load as in the decode kernel (int8 entries times their scale, fp32).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .jit_math import LOG2E, LOG2E_F, TL_DTYPES, tanh
from .launch_config import MAX_REGISTERS, prefill_config


@triton.jit
def _prefill_kernel(  # type: ignore[no-untyped-def]  # Triton JIT: typed at launch
    q_ptr,
    key_cache_ptr,
    value_cache_ptr,
    block_tables_ptr,
    query_start_loc_ptr,
    seq_lens_ptr,
    sinks_ptr,
    out_ptr,
    qk_scale,
    window,
    softcap,
    stride_qt,
    stride_qh,
    stride_qd,
    stride_cn,
    stride_ch,
    stride_ct,
    stride_cd,
    stride_bts,
    stride_btb,
    stride_ot,
    stride_oh,
    stride_od,
    QUERIES_PER_KV: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    KV_INT8: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    tile = tl.program_id(2)
    kv_head = head // QUERIES_PER_KV

    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    if tile * BLOCK_M >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    prefix_len = seq_len - q_len

    offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < q_len
    pos_m = prefix_len + offs_m  # position of each query row in its context
    rows = (q_start + offs_m).to(tl.int64)
    offs_d = tl.arange(0, DIM_PAD)
    mask_d = offs_d < HEAD_DIM
    mask_q = mask_m[:, None] & mask_d[None, :]

    q = tl.load(
        q_ptr + rows[:, None] * stride_qt + head * stride_qh + offs_d[None, :] * stride_qd,
        mask=mask_q,
        other=0.0,
    ).to(DOT_DTYPE)
    table_row = block_tables_ptr + seq.to(tl.int64) * stride_bts
    k_base = key_cache_ptr + kv_head * stride_ch
    v_base = value_cache_ptr + kv_head * stride_ch

    if HAS_SINKS:
        # The sink's logit as the running max; its exp2(0) = 1 as the sum.
        sink = tl.load(sinks_ptr + head).to(tl.float32) * LOG2E
        m_i = tl.zeros([BLOCK_M], dtype=tl.float32) + sink
        l_i = tl.full([BLOCK_M], 1.0, tl.float32)
    else:
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, DIM_PAD], dtype=tl.float32)
    # Keys past the tile's last row are causally masked for every row. Without
    # a window every row (padding rows included, whose positions are >=
    # seq_len) sees key 0, so no row is fully masked and the running max is
    # finite after the first tile; under a window, a row may see none of a
    # tile's keys, and the max is guarded below.
    kv_end = tl.minimum(seq_len, prefix_len + (tile + 1) * BLOCK_M)
    if HAS_WINDOW:
        kv_start = tl.maximum(prefix_len + tile * BLOCK_M - window + 1, 0)
    else:
        kv_start = 0
    for start in range(kv_start, kv_end, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        mask_n = offs_n < kv_end
        block = tl.load(table_row + (offs_n // BLOCK_SIZE) * stride_btb, mask=mask_n, other=0)
        block = block.to(tl.int64)
        offset = offs_n % BLOCK_SIZE

        k_rows = k_base + block[None, :] * stride_cn + offset[None, :] * stride_ct
        k_t = tl.load(  # [DIM_PAD, BLOCK_N]
            k_rows + offs_d[:, None] * stride_cd,
            mask=mask_d[:, None] & mask_n[None, :],
            other=0.0,
        )
        if KV_INT8:
            k_scale = (k_rows + HEAD_DIM * stride_cd).to(tl.pointer_type(tl.bfloat16))
            k_t = k_t.to(tl.float32) * tl.load(k_scale, mask=mask_n[None, :], other=0.0).to(
                tl.float32
            )
        s = tl.dot(q, k_t.to(DOT_DTYPE), input_precision=DOT_PRECISION) * qk_scale
        if HAS_SOFTCAP:  # s is the scaled logit: cap it, then to log2 units
            s = tanh(s / softcap) * (softcap * LOG2E)
        visible = (offs_n[None, :] <= pos_m[:, None]) & mask_n[None, :]
        if HAS_WINDOW:
            visible = visible & (offs_n[None, :] > pos_m[:, None] - window)
        s = tl.where(visible, s, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        if HAS_WINDOW:
            # A row with no visible key so far: subtract 0, not -inf.
            m_new = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)

        v_rows = v_base + block[:, None] * stride_cn + offset[:, None] * stride_ct
        v = tl.load(  # [BLOCK_N, DIM_PAD]
            v_rows + offs_d[None, :] * stride_cd,
            mask=mask_n[:, None] & mask_d[None, :],
            other=0.0,
        )
        if KV_INT8:
            v_scale = (v_rows + HEAD_DIM * stride_cd).to(tl.pointer_type(tl.bfloat16))
            v = v.to(tl.float32) * tl.load(v_scale, mask=mask_n[:, None], other=0.0).to(tl.float32)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(DOT_DTYPE), v.to(DOT_DTYPE), acc, input_precision=DOT_PRECISION)
        m_i = m_new

    if HAS_WINDOW:
        out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]  # padding rows: none seen
    else:
        out = acc / l_i[:, None]
    tl.store(
        out_ptr + rows[:, None] * stride_ot + head * stride_oh + offs_d[None, :] * stride_od,
        out.to(out_ptr.dtype.element_ty),
        mask=mask_q,
    )


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
    block_m: int | None = None,
    block_n: int | None = None,
) -> torch.Tensor:
    """Variable-length causal attention over cached prefix + new tokens.

    The new tokens' K/V must already be in the cache (``write_kv``). Sequence s
    owns query rows ``query_start_loc[s]:query_start_loc[s+1]``, which are the
    last tokens of its ``seq_lens[s]``-token context.

    Args:
        query: ``[T, Hq, D]`` (Hq a multiple of Hkv: grouped-query attention).
        key_cache, value_cache: ``[N, Hkv, bs, E]`` of any KV cache format
            (``E = D``, or ``D + 2`` for int8 entries with their scale), of
            one layout (the same strides).
        block_tables: int32 ``[S, B]``.
        query_start_loc: int32 ``[S + 1]``.
        seq_lens: int32 ``[S]``, each >= its query length.
        scale: softmax scale.
        max_query_len: longest query length, if known (saves a device sync).
        sliding_window: window in tokens: the query at position ``p`` sees
            keys ``p - sliding_window < k <= p``; None: all of ``k <= p``.
        softcap: logit soft cap ``c``: scores ``tanh(s / c) * c`` after
            scaling; None: off.
        sinks: ``[Hq]`` sink logits (float32), one more softmax column per
            query head whose weight is dropped; None: off.
        block_m, block_n: query rows / keys per tile (powers of two, >= 16);
            by default ``prefill_config``'s.
    Returns:
        ``[T, Hq, D]`` in the query's dtype (rows of no sequence are left
        uninitialised). Accumulation is fp32; fp32 inputs use exact fp32 dots.
    """
    num_tokens, num_heads, head_dim = query.shape
    num_kv_heads, block_size = key_cache.shape[1], key_cache.shape[2]
    num_seqs = seq_lens.shape[0]
    assert num_heads % num_kv_heads == 0, "Hq must be a multiple of Hkv"
    kv_int8 = key_cache.dtype == torch.int8
    assert key_cache.shape[3] == head_dim + (2 if kv_int8 else 0)
    assert value_cache.shape == key_cache.shape and value_cache.stride() == key_cache.stride()
    assert query_start_loc.shape == (num_seqs + 1,) and block_tables.shape[0] == num_seqs
    out = torch.empty_like(query)
    if num_tokens == 0 or num_seqs == 0:
        return out
    if max_query_len is None:
        max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max())
    if max_query_len <= 0:
        return out
    dim_pad = max(16, triton.next_power_of_2(head_dim))
    default_m, default_n, num_warps, num_stages = prefill_config(query.dtype, dim_pad)
    block_m = block_m or default_m
    block_n = block_n or default_n
    dot_dtype = TL_DTYPES[query.dtype]
    if dot_dtype == tl.bfloat16 and not isinstance(_prefill_kernel, triton.runtime.JITFunction):
        # The Triton interpreter multiplies bf16 bit patterns in tl.dot
        # (triton-lang/triton#11584): give it fp32 operands instead.
        dot_dtype = tl.float32
    if sinks is not None:
        sinks = sinks.to(device=query.device, dtype=torch.float32).contiguous()
        assert sinks.shape == (num_heads,), "one sink per query head"
    grid = (num_seqs, num_heads, triton.cdiv(max_query_len, block_m))
    _prefill_kernel[grid](
        query,
        key_cache,
        value_cache,
        block_tables,
        query_start_loc,
        seq_lens,
        sinks if sinks is not None else out,  # not read without sinks
        out,
        float(scale) * (1.0 if softcap is not None else LOG2E_F),
        int(sliding_window or 0),
        float(softcap or 0.0),
        *query.stride(),
        *key_cache.stride(),
        *block_tables.stride(),
        *out.stride(),
        QUERIES_PER_KV=num_heads // num_kv_heads,
        BLOCK_SIZE=block_size,
        HEAD_DIM=head_dim,
        DIM_PAD=dim_pad,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        DOT_DTYPE=dot_dtype,
        DOT_PRECISION="ieee" if dot_dtype == tl.float32 else "tf32",
        HAS_WINDOW=sliding_window is not None,
        HAS_SOFTCAP=softcap is not None,
        HAS_SINKS=sinks is not None,
        KV_INT8=kv_int8,
        num_warps=num_warps,
        num_stages=num_stages,
        maxnreg=MAX_REGISTERS,
    )
    return out
