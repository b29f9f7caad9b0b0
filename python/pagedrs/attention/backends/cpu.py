"""The CPU backend: the Rust kernels of ``pagedrs._core``.

The torch path gathers every sequence's context into a padded copy before
attending; these kernels read keys and values in place through the block
tables (PagedAttention §4.1), in parallel over (sequence, KV head) on the
OpenMP team torch already runs, so a decode step costs one pass over the
context actually held (under a sliding window, over the window's blocks only).

They run float32 and bfloat16 models over KV caches of float32, bfloat16,
fp8 (e4m3, e5m2) or int8 (per-token, per-head scales), reading each format in
place (AVX-512 where the CPU has it, AVX-512 BF16 dot products for bfloat16
queries over bfloat16 caches, portable code otherwise; chosen at run time)
and quantizing on write bit for bit as the torch reference does
(``check``). Each (sequence, KV head) reduces in one fixed order, so a
sequence's decode output does not depend on its batch. A step with prefill
chunks runs through the same kernel one query token at a time (each token
attends to the cached tokens up to its own position, in place, exactly as its
decode would), so a token's attention output has the same bits whether its
prompt was computed whole, in chunks, over a prefix-cache hit or in any batch.
"""

from __future__ import annotations

import numpy as np
import torch

import pagedrs._core as _core

from ..kv_cache_dtype import KVCacheDtype, format_of
from ..metadata import AttentionMetadata
from ..options import AttentionOptions
from .base import AttentionBackend

#: The KV cache dtypes the Rust kernels store, by name.
CPU_KV_CACHE_DTYPES = ("float32", "bfloat16", "fp8_e4m3", "fp8_e5m2", "int8")

#: The model dtypes the Rust kernels take queries and new K/V in.
CPU_MODEL_DTYPES = (torch.float32, torch.bfloat16)

#: The numpy view of each cache storage dtype (numpy has no bfloat16 or fp8).
_VIEWS = {
    torch.float32: torch.float32,
    torch.bfloat16: torch.int16,
    torch.int8: torch.int8,
    torch.float8_e4m3fn: torch.uint8,
    torch.float8_e5m2: torch.uint8,
}


def _floats(x: torch.Tensor) -> np.ndarray:
    """A contiguous float32 or bfloat16 tensor as the numpy array the kernels
    take (bfloat16 as its int16 bits); other dtypes become float32."""
    if x.dtype not in CPU_MODEL_DTYPES:
        x = x.float()
    x = x.contiguous()
    return x.view(torch.int16).numpy() if x.dtype == torch.bfloat16 else x.numpy()


def _cache(cache: torch.Tensor) -> np.ndarray:
    """A cache tensor as the numpy array of its format's element bits."""
    return cache.view(_VIEWS[cache.dtype]).numpy()


class CpuBackend(AttentionBackend):
    """Rust paged decode attention and K/V writes on CPU caches (see the module docs)."""

    name = "cpu"

    @classmethod
    def check(cls, kv_cache_dtype: KVCacheDtype, dtype: torch.dtype, device: torch.device) -> None:
        """Raises ``ValueError`` unless on CPU, the model dtype float32 or
        bfloat16 and the KV cache dtype one of ``CPU_KV_CACHE_DTYPES``."""
        if (
            device.type != "cpu"
            or dtype not in CPU_MODEL_DTYPES
            or kv_cache_dtype.name not in CPU_KV_CACHE_DTYPES
        ):
            raise ValueError(
                f"attention_backend='cpu' (the Rust kernels) cannot run kv_cache_dtype="
                f"{kv_cache_dtype.name!r} for a {dtype} model on {device.type}: it runs "
                f"float32 or bfloat16 models on CPU over KV caches of {CPU_KV_CACHE_DTYPES}; "
                "use attention_backend='torch' or 'auto'"
            )

    def write_kv(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        """As ``AttentionBackend.write_kv`` (contiguous caches).

        Raises:
            ValueError: inconsistent shapes or a slot outside the cache.
        """
        if key.dtype != value.dtype:
            value = value.to(key.dtype)
        _core.write_kv(
            _floats(key),
            _floats(value),
            _cache(key_cache),
            _cache(value_cache),
            slot_mapping.to(torch.int64).contiguous().numpy(),
            kv_cache_dtype=format_of(key_cache).name,
        )

    def decode(
        self,
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        opts: AttentionOptions,
        query_rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """As ``AttentionBackend.decode`` (contiguous caches; a float32 or
        bfloat16 query, computed in float32, returned in its dtype), through
        ``_core.paged_decode_attention``: query ``i`` reads block-table row
        ``query_rows[i]`` (default ``i``) up to ``seq_lens[i]`` tokens.

        Raises:
            ValueError: inconsistent shapes or a block id outside the cache.
        """
        q = query.contiguous() if query.dtype in CPU_MODEL_DTYPES else query.float()
        out = torch.empty_like(q)
        _core.paged_decode_attention(
            _floats(q),
            _cache(key_cache),
            _cache(value_cache),
            block_tables.to(torch.int32).contiguous().numpy(),
            seq_lens.to(torch.int32).contiguous().numpy(),
            opts.scale,
            _floats(out),
            torch.get_num_threads(),
            sliding_window=opts.sliding_window,
            softcap=opts.softcap,
            sinks=None if opts.sinks is None else opts.sinks.contiguous().numpy(),
            kv_cache_dtype=format_of(key_cache).name,
            query_rows=None if query_rows is None else query_rows.numpy(),
        )
        return out.to(query.dtype)

    def mixed(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        meta: AttentionMetadata,
        opts: AttentionOptions,
    ) -> torch.Tensor:
        """As ``AttentionBackend.mixed``: every token of the step (``[T, Hq,
        D]``) attends through its sequence's block table to the cached tokens
        up to its own position (``meta.token_rows`` / ``meta.token_lens``),
        K/V read in place in the cache's format.

        Raises:
            ValueError: inconsistent shapes or a block id outside the cache.
        """
        rows, lens = meta.token_rows, meta.token_lens
        assert rows is not None and lens is not None, "a mixed step's metadata has token rows"
        return self.decode(query, key_cache, value_cache, meta.block_tables, lens, opts, rows)
