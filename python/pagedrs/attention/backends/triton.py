"""The Triton backend: the GPU kernels of ``pagedrs.kernels``
(``python/pagedrs/kernels/``); on CPU they run under ``TRITON_INTERPRET=1``.

Every KV cache dtype: writes store the reference's bits (``kernels.kv_format``),
attention widens each entry to fp32 as it loads (int8 times its scale). On a
GPU, fp8 e4m3 needs compute capability 8.9 or newer (``check``).
"""

from __future__ import annotations

import torch

from ..kv_cache_dtype import KVCacheDtype
from ..metadata import AttentionMetadata
from ..options import AttentionOptions
from .base import AttentionBackend, KVCaches

#: Oldest CUDA compute capability whose Triton has the e4m3 fp8 type.
FP8_E4M3_MIN_CAPABILITY = (8, 9)


class TritonBackend(AttentionBackend):
    """Triton kernels: K/V writes, decode, one launch per mixed step, block copies."""

    name = "triton"

    def __init__(self) -> None:
        from ... import kernels  # imports triton: only when this backend is chosen

        self._k = kernels

    @classmethod
    def check(cls, kv_cache_dtype: KVCacheDtype, dtype: torch.dtype, device: torch.device) -> None:
        """Raises ``ValueError`` for kv_cache_dtype "fp8_e4m3" on a GPU older
        than compute capability 8.9 (Triton has no e4m3 type there)."""
        if kv_cache_dtype.name == "fp8_e4m3" and device.type == "cuda":
            capability = torch.cuda.get_device_capability(device)
            if capability < FP8_E4M3_MIN_CAPABILITY:
                raise ValueError(
                    "attention_backend='triton' cannot run kv_cache_dtype='fp8_e4m3' on a GPU "
                    f"of compute capability {capability} (needs "
                    f"{FP8_E4M3_MIN_CAPABILITY} or newer); use 'fp8_e5m2', 'int8' or "
                    "attention_backend='torch'"
                )

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
        opts: AttentionOptions,
    ) -> torch.Tensor:
        return self._k.paged_decode_attention(
            query,
            key_cache,
            value_cache,
            block_tables,
            seq_lens,
            opts.scale,
            **opts.features(),
        )

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
        """One launch for the whole step: a decode is a one-token prefill."""
        return self._k.paged_prefill_attention(
            query,
            key_cache,
            value_cache,
            meta.block_tables,
            meta.query_start_loc,
            meta.seq_lens,
            opts.scale,
            max_query_len=meta.max_query_len,
            **opts.features(),
        )

    def copy_blocks(self, kv_caches: KVCaches, block_mapping: torch.Tensor) -> None:
        self._k.copy_blocks([k for k, _ in kv_caches], [v for _, v in kv_caches], block_mapping)
