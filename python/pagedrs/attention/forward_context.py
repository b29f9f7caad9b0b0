"""The state a model forward pass needs beyond its inputs: KV caches and metadata.

HF attention modules only see their own tensors, so the runner publishes the
step's metadata here before calling the model (as vLLM's forward context does).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from .backends import AttentionBackend
from .metadata import AttentionMetadata


@dataclass
class ForwardContext:
    """KV caches per layer (``[N, Hkv, bs, D]`` each), this step's metadata and
    the attention backend that runs every layer."""

    kv_caches: list[tuple[torch.Tensor, torch.Tensor]]
    metadata: AttentionMetadata
    backend: AttentionBackend


_current: ForwardContext | None = None


def get_forward_context() -> ForwardContext:
    """The context of the forward pass in progress.

    Raises:
        RuntimeError: outside ``set_forward_context``.
    """
    if _current is None:
        raise RuntimeError("paged attention called outside a pagedrs forward pass")
    return _current


@contextmanager
def set_forward_context(ctx: ForwardContext) -> Iterator[None]:
    """Publish ``ctx`` for the duration of one forward pass."""
    global _current
    prev, _current = _current, ctx
    try:
        yield
    finally:
        _current = prev
