"""Copy whole KV-cache blocks src -> dst in every layer (copy-on-write), in Triton."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _copy_blocks_kernel(  # type: ignore[no-untyped-def]  # Triton JIT: typed at launch
    key_cache_ptr,
    value_cache_ptr,
    mapping_ptr,
    stride_cn,
    stride_ch,
    stride_ct,
    stride_cd,
    stride_map,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_NUMEL: tl.constexpr,
    CHUNK: tl.constexpr,
):
    # Program (pair, chunk) copies CHUNK elements of one [Hkv, bs, D] block.
    pair = tl.program_id(0).to(tl.int64)
    src = tl.load(mapping_ptr + pair * stride_map).to(tl.int64)
    dst = tl.load(mapping_ptr + pair * stride_map + 1).to(tl.int64)

    idx = tl.program_id(1) * CHUNK + tl.arange(0, CHUNK)
    mask = idx < BLOCK_NUMEL
    d = idx % HEAD_DIM
    t = (idx // HEAD_DIM) % BLOCK_SIZE
    h = idx // (HEAD_DIM * BLOCK_SIZE)

    off = h * stride_ch + t * stride_ct + d * stride_cd  # both caches: one layout
    k = tl.load(key_cache_ptr + src * stride_cn + off, mask=mask)
    v = tl.load(value_cache_ptr + src * stride_cn + off, mask=mask)
    tl.store(key_cache_ptr + dst * stride_cn + off, k, mask=mask)
    tl.store(value_cache_ptr + dst * stride_cn + off, v, mask=mask)


def copy_blocks(
    key_caches: list[torch.Tensor],
    value_caches: list[torch.Tensor],
    block_mapping: torch.Tensor,
) -> None:
    """Copy block ``src`` to block ``dst`` for each mapping row, in every layer, in place.

    Args:
        key_caches, value_caches: one ``[N, Hkv, bs, E]`` tensor per layer,
            a layer's two of one layout (the same strides); whole entries
            move (an int8 entry's scale with its values).
        block_mapping: int64 ``[M, 2]`` of ``(src, dst)`` physical block pairs.
            Pairs run in parallel: dst blocks must be distinct and not also
            used as a src in the same call (true for copy-on-write).
    """
    assert len(key_caches) == len(value_caches)
    num_pairs = block_mapping.shape[0]
    if num_pairs == 0:
        return
    assert block_mapping.shape == (num_pairs, 2)
    mapping = block_mapping.contiguous()
    for key_cache, value_cache in zip(key_caches, value_caches, strict=True):
        assert value_cache.shape == key_cache.shape and value_cache.stride() == key_cache.stride()
        _, num_kv_heads, block_size, head_dim = key_cache.shape
        numel = num_kv_heads * block_size * head_dim
        chunk = min(1024, triton.next_power_of_2(numel))
        _copy_blocks_kernel[(num_pairs, triton.cdiv(numel, chunk))](
            key_cache,
            value_cache,
            mapping,
            *key_cache.stride(),
            mapping.stride(0),
            BLOCK_SIZE=block_size,
            HEAD_DIM=head_dim,
            BLOCK_NUMEL=numel,
            CHUNK=chunk,
        )
