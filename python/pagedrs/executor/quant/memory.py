"""The bytes a loaded model's weights hold: float parameters and buffers,
quantized weights (``QuantizedWeight``, expert stacks included), and oneDNN-packed projections of
the native model, each storage counted once (tied and shared tensors, views
of one fused matrix, a memory-mapped file's bytes)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from .experts import QuantizedExperts
from .modules import QuantizedEmbedding, QuantizedLinearModule
from .weight import QuantizedWeight


def _tensors(model: nn.Module) -> Iterable[torch.Tensor]:
    yield from model.parameters()
    yield from model.buffers()
    for module in model.modules():
        if isinstance(module, (QuantizedLinearModule, QuantizedEmbedding)):
            yield from _quantized(module.qweight)
        elif isinstance(module, QuantizedExperts):
            for stack in module.stacks:
                yield from _quantized(stack)


def _quantized(weight: QuantizedWeight) -> Iterable[torch.Tensor]:
    yield weight.data
    if weight.scales is not None:
        yield weight.scales


def _storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    seen: set[tuple[str, int]] = set()
    total = 0
    for t in tensors:
        if t is None or t.is_meta:
            continue
        if t.is_mkldnn:  # oneDNN's opaque layout: no storage to read, its values' bytes
            if ("mkldnn", id(t)) not in seen:
                seen.add(("mkldnn", id(t)))
                total += t.numel() * t.element_size()
            continue
        storage = t.untyped_storage()
        key = (str(t.device), storage.data_ptr())
        if key in seen:
            continue
        seen.add(key)
        total += storage.nbytes()
    return total


def weight_nbytes(model: nn.Module, extra: Iterable[Any] = ()) -> int:
    """Bytes of ``model``'s weights (module docs), plus the tensors in
    ``extra`` (packed copies held outside the model), each storage once."""
    return _storage_bytes([*_tensors(model), *extra])
