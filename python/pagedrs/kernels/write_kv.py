"""Scatter new K/V token states into the paged KV cache (Triton)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _write_kv_kernel(
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
    stride_kcn,
    stride_kch,
    stride_kct,
    stride_kcd,
    stride_vcn,
    stride_vch,
    stride_vct,
    stride_vcd,
    num_kv_heads,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    DIM_PAD: tl.constexpr,
):
    # One program per token: copies its [Hkv, D] key and value tiles.
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
    dst_k = (
        key_cache_ptr
        + block * stride_kcn
        + offset * stride_kct
        + offs_h[:, None] * stride_kch
        + offs_d[None, :] * stride_kcd
    )
    dst_v = (
        value_cache_ptr
        + block * stride_vcn
        + offset * stride_vct
        + offs_h[:, None] * stride_vch
        + offs_d[None, :] * stride_vcd
    )
    k = tl.load(src_k, mask=mask, other=0.0)
    v = tl.load(src_v, mask=mask, other=0.0)
    tl.store(dst_k, k.to(key_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(dst_v, v.to(value_cache_ptr.dtype.element_ty), mask=mask)


def write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store new K/V into their slots of the paged caches, in place.

    Args:
        key, value: ``[T, Hkv, D]`` (any float dtype, any strides).
        key_cache, value_cache: ``[N, Hkv, bs, D]``; written in their own dtype.
        slot_mapping: int64 ``[T]``, ``block * bs + offset`` per token; slots < 0
            (padding tokens) are skipped.
    """
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    assert value.shape == key.shape
    assert key_cache.shape[1] == num_kv_heads and key_cache.shape[3] == head_dim
    assert value_cache.shape == key_cache.shape
    assert slot_mapping.shape == (num_tokens,)
    _write_kv_kernel[(num_tokens,)](
        key,
        value,
        key_cache,
        value_cache,
        slot_mapping,
        *key.stride(),
        *value.stride(),
        *key_cache.stride(),
        *value_cache.stride(),
        num_kv_heads,
        BLOCK_SIZE=key_cache.shape[2],
        HEAD_DIM=head_dim,
        HEADS_PAD=triton.next_power_of_2(num_kv_heads),
        DIM_PAD=triton.next_power_of_2(head_dim),
    )
