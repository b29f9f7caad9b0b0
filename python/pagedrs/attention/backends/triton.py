"""The Triton backend: the GPU kernels of the top-level ``kernels/`` folder
(shipped as ``pagedrs.kernels``); on CPU they run under ``TRITON_INTERPRET=1``."""

from __future__ import annotations

import torch

from ..metadata import AttentionMetadata
from .base import AttentionBackend, KVCaches


class TritonBackend(AttentionBackend):
    """Triton kernels: K/V writes, decode, one launch per mixed step, block copies."""

    name = "triton"

    def __init__(self) -> None:
        from ... import kernels  # imports triton: only when this backend is chosen

        self._k = kernels

    def write_kv(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        self._k.write_kv(key, value, key_cache, value_cache, slot_mapping)

    def decode(
        self,
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
        return self._k.paged_decode_attention(
            query,
            key_cache,
            value_cache,
            block_tables,
            seq_lens,
            scale,
            sliding_window=sliding_window,
            softcap=softcap,
            sinks=sinks,
        )

    def mixed(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        *,
        sliding_window: int | None = None,
        softcap: float | None = None,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One launch for the whole step: a decode is a one-token prefill."""
        return self._k.paged_prefill_attention(
            query,
            key_cache,
            value_cache,
            meta.block_tables,
            meta.query_start_loc,
            meta.seq_lens,
            scale,
            max_query_len=meta.max_query_len,
            sliding_window=sliding_window,
            softcap=softcap,
            sinks=sinks,
        )

    def copy_blocks(self, kv_caches: KVCaches, block_mapping: torch.Tensor) -> None:
        self._k.copy_blocks([k for k, _ in kv_caches], [v for _, v in kv_caches], block_mapping)
