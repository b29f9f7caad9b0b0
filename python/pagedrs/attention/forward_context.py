"""The state a model forward pass needs beyond its inputs: KV caches and metadata.

HF attention modules only see their own tensors, so the runner publishes the
step's metadata here before calling the model (as vLLM's forward context does).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from .backends import AttentionBackend
from .metadata import AttentionMetadata


@dataclass
class ForwardContext:
    """What every layer of one forward pass reads.

    Attributes:
        kv_caches: ``(key_cache, value_cache)`` of each model layer (its KV
            cache group's tensor pair, ``[N, Hkv, bs, E]`` each).
        metadata: this step's metadata of each KV cache group, in order.
        backend: the attention backend that runs every layer.
        layer_groups: the KV cache group of each model layer; None: every
            layer in group 0.
        group_windows: each group's sliding window (None: full attention);
            None: no group is a sliding one.
    """

    kv_caches: Sequence[tuple[torch.Tensor, torch.Tensor]]
    metadata: Sequence[AttentionMetadata]
    backend: AttentionBackend
    layer_groups: Sequence[int] | None = None
    group_windows: Sequence[int | None] | None = None

    def group_of(self, layer: int) -> int:
        """The KV cache group of model layer ``layer``."""
        return 0 if self.layer_groups is None else self.layer_groups[layer]

    def window_of(self, group: int) -> int | None:
        """The sliding window of KV cache group ``group`` (None: full attention)."""
        return None if self.group_windows is None else self.group_windows[group]


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
