"""The native models' projections, built once from the loaded HF model.

A decoder layer's q/k/v projections become one fused projection, as do the
MLP's gate and up projections (a checkpoint that stores them fused, as
Phi-3's ``qkv_proj`` / ``gate_up_proj``, is one already). Float weights are
stacked into one matrix and HF's own projection weights become views of it,
so HF's modules (the reference in tests) keep working on the same numbers;
a bfloat16 matrix packed for oneDNN replaces the plain one and HF's modules
become ``PackedRows`` over it (``linear``). Quantized projections
(``QuantizedLinearModule``, GGUF files) become one ``QuantizedLinear`` over
their parts' blocks as they are.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any

import torch
from torch import nn

from ..quant.linear import QuantizedLinear
from ..quant.modules import QuantizedLinearModule
from .linear import Linear, PackedRows

Projection = Linear | QuantizedLinear


def _fuse(linears: list[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Stack the rows of ``linears`` into one weight (and bias); rebind each
    module's parameters as views of the fused tensors."""
    weight = torch.cat([m.weight.detach() for m in linears]).contiguous()
    bias = None
    if any(m.bias is not None for m in linears):
        bias = torch.cat(
            [
                m.bias.detach() if m.bias is not None else weight.new_zeros(m.out_features)
                for m in linears
            ]
        )
    row = 0
    for m in linears:
        n = m.out_features
        m.weight = nn.Parameter(weight[row : row + n], requires_grad=False)
        if bias is not None and m.bias is not None:
            m.bias = nn.Parameter(bias[row : row + n], requires_grad=False)
        row += n
    return weight, bias


def fused(modules: list[Any], batch_invariant: bool = False) -> Projection:
    """One projection over ``modules``' output rows, in their order: a
    ``QuantizedLinear`` over their quantized weight parts (formats may
    differ), or a ``Linear`` over fused float weights (HF's weights become
    views of it), batch-invariant with ``batch_invariant`` (quantized ones
    always are).

    Raises:
        ValueError: quantized and float projections mixed, or quantized parts
            of different activation quantizations.
    """
    quantized = [isinstance(m, QuantizedLinearModule) for m in modules]
    if all(quantized):
        parts = [m.qweight for m in modules]
        biases = [m.bias for m in modules]
        bias = None
        if any(b is not None for b in biases):
            bias = torch.cat(
                [
                    b.detach() if b is not None else torch.zeros(m.out_features)
                    for b, m in zip(biases, modules, strict=True)
                ]
            )
        activations = {m.activations for m in modules if isinstance(m, QuantizedLinearModule)}
        if len(activations) != 1:
            raise ValueError(f"a fused projection of parts with activations {sorted(activations)}")
        return QuantizedLinear(parts, bias, activations=activations.pop())
    if any(quantized):
        raise ValueError("a fused projection of quantized and float parts")
    weight, bias = _fuse(modules)
    return Linear(weight, bias, batch_invariant=batch_invariant)


def single(module: Any, batch_invariant: bool = False) -> Projection:
    """The projection of one HF module (``nn.Linear`` or
    ``QuantizedLinearModule``), on its own weight (no copy)."""
    if isinstance(module, QuantizedLinearModule):
        return module.linear
    bias = getattr(module, "bias", None)
    return Linear(module.weight, bias, batch_invariant=batch_invariant)


def replace_plain(parent: nn.Module, names: list[str], linear: Projection) -> bool:
    """If ``linear`` is packed: put a ``PackedRows`` over its rows in the
    place of each of ``parent``'s modules ``names`` (in the order their rows
    were fused) and drop its plain weight. Returns whether it did."""
    if not isinstance(linear, Linear) or linear.packed is None:
        return False
    row = 0
    for name in names:
        module = getattr(parent, name)
        n = module.out_features
        setattr(parent, name, PackedRows(linear, row, row + n, getattr(module, "bias", None)))
        row += n
    linear.release_plain()
    return True


def projection(
    parent: nn.Module, names: list[str], batch_invariant: bool = False
) -> tuple[Projection, torch.Tensor | None]:
    """``parent``'s modules ``names`` as one projection (``fused``; one name:
    ``single``), packed ones put in HF's place (``replace_plain``).

    Returns:
        (the projection, its plain float matrix that HF's modules are views
        of, or None when quantized, packed or a single module's own weight).
    """
    modules = [getattr(parent, name) for name in names]
    if len(modules) == 1:
        linear = single(modules[0], batch_invariant)
        replace_plain(parent, names, linear)
        return linear, None
    linear = fused(modules, batch_invariant)
    plain = linear.weight if isinstance(linear, Linear) else None
    if replace_plain(parent, names, linear):
        plain = None
    return linear, plain


def return_freed_memory() -> None:
    """Hand the heap's free pages back to the OS (glibc's ``malloc_trim``):
    the plain weights freed after packing sit in the heap otherwise, out of
    the process's use until later allocations reuse them. A no-op without
    glibc."""
    name = ctypes.util.find_library("c")
    if name is None:
        return
    trim = getattr(ctypes.CDLL(name), "malloc_trim", None)
    if trim is not None:
        trim(0)
