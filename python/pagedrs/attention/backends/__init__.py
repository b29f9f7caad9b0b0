"""Attention backends by ``attention_backend`` name: "torch" (reference),
"cpu" (Rust kernels), "triton" (GPU kernels)."""

from __future__ import annotations

from ..options import AttentionOptions
from .base import AttentionBackend, KVCaches
from .cpu import CpuBackend
from .torch_ref import TorchBackend
from .triton import TritonBackend

BACKENDS: dict[str, type[AttentionBackend]] = {
    b.name: b for b in (TorchBackend, CpuBackend, TritonBackend)
}


def get_attention_backend(name: str) -> AttentionBackend:
    """The backend named ``name`` (a key of ``BACKENDS``).

    Raises:
        ValueError: an unknown name.
    """
    try:
        return BACKENDS[name]()
    except KeyError:
        raise ValueError(
            f"attention_backend must be one of {sorted(BACKENDS)}, got {name!r}"
        ) from None


__all__ = ["BACKENDS", "AttentionBackend", "AttentionOptions", "KVCaches", "get_attention_backend"]
