"""The Triton backend: the GPU kernels of ``pagedrs.kernels``
(``python/pagedrs/kernels/``); on CPU they run under ``TRITON_INTERPRET=1``.

Every KV cache dtype: writes store the reference's bits (``kernels.kv_format``),
attention widens each entry to fp32 as it loads (int8 times its scale). On a
GPU, fp8 e4m3 needs compute capability 8.9 or newer (``check``).
"""

from __future__ import annotations

import torch

from ..kv_cache_dtype import KVCacheDtype
from .base import AttentionBackend

#: Oldest CUDA compute capability whose Triton has the e4m3 fp8 type.
FP8_E4M3_MIN_CAPABILITY = (8, 9)


class TritonBackend(AttentionBackend):
    """Triton kernels (``ops``): K/V writes, decode, one launch per mixed step
    (``AttentionBackend.mixed``), block copies."""

    name = "triton"

    def __init__(self) -> None:
        from ... import kernels  # imports triton: only when this backend is chosen

        super().__init__(kernels)

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
