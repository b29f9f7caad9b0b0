"""Scatter new K/V token states into the paged KV cache (Triton), in the
cache's format (``kv_format``: a cast, bfloat16 or fp8 bits, int8 entries
with their scale)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .kv_format import bf16_bits, fp8_bits, int8_entries, store_format


@triton.jit
def _write_kv_kernel(  # type: ignore[no-untyped-def]  # Triton JIT: typed at launch
    key_ptr,
    value_ptr,
    key_cache_ptr,
    value_cache_ptr,
    slot_ptr,
    stride_kt,
    stride_kh,
    stride_kd,
    stride_vt,
    stride_vh,
    stride_vd,
    stride_cn,
    stride_ch,
    stride_ct,
    stride_cd,
    num_kv_heads,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    DIM_PAD: tl.constexpr,
    FORMAT: tl.constexpr,
):
    # One program per token: stores its [Hkv, D] key and value tiles.
    tok = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + tok).to(tl.int64)
    if slot < 0:  # padding token
        return
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE

    offs_h = tl.arange(0, HEADS_PAD)
    offs_d = tl.arange(0, DIM_PAD)
    mask = (offs_h[:, None] < num_kv_heads) & (offs_d[None, :] < HEAD_DIM)

    src_k = key_ptr + tok * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :] * stride_kd
    src_v = value_ptr + tok * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :] * stride_vd
    # Entry (block, offset, head) of either cache (one layout: asserted).
    entry = block * stride_cn + offset * stride_ct + offs_h * stride_ch
    cols = offs_d[None, :] * stride_cd
    dst_k = key_cache_ptr + entry[:, None] + cols
    dst_v = value_cache_ptr + entry[:, None] + cols
    k = tl.load(src_k, mask=mask, other=0.0)
    v = tl.load(src_v, mask=mask, other=0.0)
    if FORMAT == 0:
        tl.store(dst_k, k.to(key_cache_ptr.dtype.element_ty), mask=mask)
        tl.store(dst_v, v.to(value_cache_ptr.dtype.element_ty), mask=mask)
    elif FORMAT == 1:
        tl.store(dst_k, bf16_bits(k.to(tl.float32)).to(tl.uint16), mask=mask)
        tl.store(dst_v, bf16_bits(v.to(tl.float32)).to(tl.uint16), mask=mask)
    elif FORMAT == 2:
        # Each entry's bfloat16 scale in the two bytes after its values.
        mask_h = offs_h < num_kv_heads
        qk, sk = int8_entries(k.to(tl.float32), mask)
        qv, sv = int8_entries(v.to(tl.float32), mask)
        tl.store(dst_k, qk, mask=mask)
        tl.store(dst_v, qv, mask=mask)
        scale_at = entry + HEAD_DIM * stride_cd
        scale_k = (key_cache_ptr + scale_at).to(tl.pointer_type(tl.uint16))
        scale_v = (value_cache_ptr + scale_at).to(tl.pointer_type(tl.uint16))
        tl.store(scale_k, sk, mask=mask_h)
        tl.store(scale_v, sv, mask=mask_h)
    elif FORMAT == 3:
        tl.store(dst_k, fp8_bits(k.to(tl.float32), 3, 7, 448.0).to(tl.uint8), mask=mask)
        tl.store(dst_v, fp8_bits(v.to(tl.float32), 3, 7, 448.0).to(tl.uint8), mask=mask)
    else:
        tl.store(dst_k, fp8_bits(k.to(tl.float32), 2, 15, 57344.0).to(tl.uint8), mask=mask)
        tl.store(dst_v, fp8_bits(v.to(tl.float32), 2, 15, 57344.0).to(tl.uint8), mask=mask)


def write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store new K/V into their slots of the paged caches, in place, in the
    caches' format (as ``attention.kv_cache_dtype.quantize``).

    Args:
        key, value: ``[T, Hkv, D]`` (any float dtype, any strides).
        key_cache, value_cache: ``[N, Hkv, bs, E]`` (``E = D``, or ``D + 2``
            for int8 entries with their scale; contiguous last dim), of one
            layout (the same strides).
        slot_mapping: int64 ``[T]``, ``block * bs + offset`` per token; slots < 0
            (padding tokens) are skipped.
    """
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    assert value.shape == key.shape
    fmt, k_dst = store_format(key_cache)
    _, v_dst = store_format(value_cache)
    entry = head_dim + (2 if key_cache.dtype == torch.int8 else 0)
    assert key_cache.shape[1] == num_kv_heads and key_cache.shape[3] == entry
    assert value_cache.shape == key_cache.shape and value_cache.dtype == key_cache.dtype
    assert value_cache.stride() == key_cache.stride(), "one layout of both caches"
    assert slot_mapping.shape == (num_tokens,)
    _write_kv_kernel[(num_tokens,)](
        key,
        value,
        k_dst,
        v_dst,
        slot_mapping,
        *key.stride(),
        *value.stride(),
        *key_cache.stride(),
        num_kv_heads,
        BLOCK_SIZE=key_cache.shape[2],
        HEAD_DIM=head_dim,
        HEADS_PAD=triton.next_power_of_2(num_kv_heads),
        DIM_PAD=triton.next_power_of_2(head_dim),
        FORMAT=fmt,
    )
