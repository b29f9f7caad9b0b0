"""Paged attention for decode steps: one query token per sequence (Triton).

One program per (sequence, query head) walks the sequence's context ``BLOCK_N``
tokens at a time, finding each token's physical slot through the block table,
and keeps a running (online) softmax in fp32.

Optional features, each a constexpr flag so the default kernel is compiled
without them (HF transformers' eager semantics): a sliding window (the loop
starts at the window's first token, so earlier K/V are never read), a logit
soft cap (``tanh(s / c) * c`` after scaling) and attention sinks (a per-head
logit that seeds the running softmax: max = sink, sum = 1).

The caches may hold any KV cache format: float and fp8 elements widen to
fp32 as they load; int8 entries (``KV_INT8``) are multiplied by their
bfloat16 scale, read from the two bytes after each entry's values.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_LOG2E = 1.4426950408889634
LOG2E = tl.constexpr(_LOG2E)  # the same, readable inside kernels


@triton.jit
def tanh(x):
    """``tanh`` from ``exp`` (the interpreter has no libdevice): an odd Taylor
    polynomial near 0, ``(1 - e) / (1 + e)`` with ``e = exp(-2|x|)`` elsewhere;
    both within a few float32 ulps."""
    ax = tl.abs(x)
    e = tl.exp(-2.0 * ax)
    far = (1.0 - e) / (1.0 + e)
    x2 = ax * ax
    near = ax * (1.0 + x2 * (-1.0 / 3.0 + x2 * (2.0 / 15.0 + x2 * (-17.0 / 315.0))))
    t = tl.where(ax < 0.125, near, far)
    return tl.where(x < 0.0, -t, t)


@triton.jit
def _decode_kernel(
    q_ptr,
    key_cache_ptr,
    value_cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    sinks_ptr,
    out_ptr,
    qk_scale,
    window,
    softcap,
    stride_qs,
    stride_qh,
    stride_qd,
    stride_kcn,
    stride_kch,
    stride_kct,
    stride_kcd,
    stride_vcn,
    stride_vch,
    stride_vct,
    stride_vcd,
    stride_bts,
    stride_btb,
    stride_os,
    stride_oh,
    stride_od,
    QUERIES_PER_KV: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    KV_INT8: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    kv_head = head // QUERIES_PER_KV
    seq_len = tl.load(seq_lens_ptr + seq)

    offs_d = tl.arange(0, DIM_PAD)
    mask_d = offs_d < HEAD_DIM
    q = tl.load(q_ptr + seq * stride_qs + head * stride_qh + offs_d * stride_qd, mask=mask_d)
    # Fold the softmax scale (and, without a soft cap, log2(e)) into q so that
    # exp2 can be used below.
    q = q.to(tl.float32) * qk_scale

    table_row = block_tables_ptr + seq * stride_bts
    k_base = key_cache_ptr + kv_head * stride_kch
    v_base = value_cache_ptr + kv_head * stride_vch

    if HAS_SINKS:
        # The sink's logit as the running max; its exp2(0) = 1 as the sum.
        sink = tl.load(sinks_ptr + head).to(tl.float32) * LOG2E
        m_i = tl.zeros([1], dtype=tl.float32) + sink
        l_i = tl.full([1], 1.0, tl.float32)
    else:
        m_i = tl.full([1], float("-inf"), tl.float32)
        l_i = tl.zeros([1], dtype=tl.float32)
    acc = tl.zeros([DIM_PAD], dtype=tl.float32)
    if HAS_WINDOW:
        lo = tl.maximum(seq_len - window, 0)
    else:
        lo = 0
    for start in range(lo, seq_len, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        mask_n = offs_n < seq_len
        block = tl.load(table_row + (offs_n // BLOCK_SIZE) * stride_btb, mask=mask_n, other=0)
        block = block.to(tl.int64)
        offset = offs_n % BLOCK_SIZE
        mask_kv = mask_n[:, None] & mask_d[None, :]

        k_rows = k_base + block[:, None] * stride_kcn + offset[:, None] * stride_kct
        k = tl.load(k_rows + offs_d[None, :] * stride_kcd, mask=mask_kv, other=0.0)
        k = k.to(tl.float32)
        if KV_INT8:
            k_scale = (k_rows + HEAD_DIM * stride_kcd).to(tl.pointer_type(tl.bfloat16))
            k = k * tl.load(k_scale, mask=mask_n[:, None], other=0.0).to(tl.float32)
        s = tl.sum(q[None, :] * k, axis=1)  # [BLOCK_N], in log2 units
        if HAS_SOFTCAP:  # s is the scaled logit: cap it, then to log2 units
            s = tanh(s / softcap) * (softcap * LOG2E)
        s = tl.where(mask_n, s, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=0)

        v_rows = v_base + block[:, None] * stride_vcn + offset[:, None] * stride_vct
        v = tl.load(v_rows + offs_d[None, :] * stride_vcd, mask=mask_kv, other=0.0)
        v = v.to(tl.float32)
        if KV_INT8:
            v_scale = (v_rows + HEAD_DIM * stride_vcd).to(tl.pointer_type(tl.bfloat16))
            v = v * tl.load(v_scale, mask=mask_n[:, None], other=0.0).to(tl.float32)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        m_i = m_new

    # seq_len == 0 (not a valid input) yields zeros rather than NaN.
    out = acc / tl.where(l_i > 0.0, l_i, 1.0)
    tl.store(
        out_ptr + seq * stride_os + head * stride_oh + offs_d * stride_od,
        out.to(out_ptr.dtype.element_ty),
        mask=mask_d,
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
    block_n: int = 32,
) -> torch.Tensor:
    """One query token per sequence attending to its paged context.

    Args:
        query: ``[S, Hq, D]`` (Hq a multiple of Hkv: grouped-query attention;
            query head ``h`` reads KV head ``h // (Hq // Hkv)``).
        key_cache, value_cache: ``[N, Hkv, bs, E]`` of any KV cache format
            (``E = D``, or ``D + 2`` for int8 entries with their scale).
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
        block_n: context tokens per loop iteration (a power of two).
    Returns:
        ``[S, Hq, D]`` in the query's dtype (computed in fp32).
    """
    num_seqs, num_heads, head_dim = query.shape
    num_kv_heads, block_size = key_cache.shape[1], key_cache.shape[2]
    assert num_heads % num_kv_heads == 0, "Hq must be a multiple of Hkv"
    kv_int8 = key_cache.dtype == torch.int8
    assert key_cache.shape[3] == head_dim + (2 if kv_int8 else 0)
    assert value_cache.shape == key_cache.shape
    assert block_tables.shape[0] == num_seqs and seq_lens.shape == (num_seqs,)
    out = torch.empty_like(query)
    if num_seqs == 0:
        return out
    if sinks is not None:
        sinks = sinks.to(device=query.device, dtype=torch.float32).contiguous()
        assert sinks.shape == (num_heads,), "one sink per query head"
    _decode_kernel[(num_seqs, num_heads)](
        query,
        key_cache,
        value_cache,
        block_tables,
        seq_lens,
        sinks if sinks is not None else out,  # not read without sinks
        out,
        float(scale) * (1.0 if softcap is not None else _LOG2E),
        int(sliding_window or 0),
        float(softcap or 0.0),
        *query.stride(),
        *key_cache.stride(),
        *value_cache.stride(),
        *block_tables.stride(),
        *out.stride(),
        QUERIES_PER_KV=num_heads // num_kv_heads,
        BLOCK_SIZE=block_size,
        HEAD_DIM=head_dim,
        DIM_PAD=triton.next_power_of_2(head_dim),
        BLOCK_N=block_n,
        HAS_WINDOW=sliding_window is not None,
        HAS_SOFTCAP=softcap is not None,
        HAS_SINKS=sinks is not None,
        KV_INT8=kv_int8,
        num_warps=4,
    )
    return out
