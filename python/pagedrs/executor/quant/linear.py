"""A projection ``y = x @ W^T (+ b)`` whose weight stays quantized.

``W`` is one or more ``QuantizedWeight`` parts stacked along the output
features: a fused projection (q/k/v, gate/up) whose parts a GGUF file stores
in different formats (Q4_K_M keeps some in Q6_K) is one call over its parts,
its output the parts' outputs side by side.

On CPU the product runs in the Rust kernels (``pagedrs._core.QuantWeights``,
``rust/pagedrs-kernels/src/quant``) on the parts' bytes as they are, without a float copy:
each activation row quantized per block of 32 values (a float32 scale per
block) to int16 or to int8 (``ACTIVATION_QUANTIZATIONS``: int16 the exact
option, int8 llama.cpp's Q8_0 blocks run by ``vpdpbusd``), exact integer
products per 32-value weight sub-block,
float32 accumulation in an order fixed per (row, output), so a row's output
bits do not depend on the other rows of the call, the kernel variant, or
the thread count. ``reference`` is the math they are checked against:
dequantize each part to float32 (``QuantizedWeight.dequantize``) and run
``F.linear``; tensors on other devices take it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F

import pagedrs._core as _core

from .weight import QuantizedWeight

#: How a quantized projection quantizes its activations, per block of 32
#: values: "int16" (``d = max|x| / 32767``) or "int8" (``d = max|x| / 127``).
ACTIVATION_QUANTIZATIONS = ("int16", "int8")


def check_activations(activations: str) -> str:
    """``activations`` if it is one of ``ACTIVATION_QUANTIZATIONS``.

    Raises:
        ValueError: naming the value and the choices.
    """
    if activations not in ACTIVATION_QUANTIZATIONS:
        raise ValueError(
            f"activation quantization {activations!r} is not one of {ACTIVATION_QUANTIZATIONS}"
        )
    return activations


def quant_isas() -> list[str]:
    """The kernel variants this CPU runs, fastest first ("avx512_vnni",
    "avx2", "portable"); each gives the same bits."""
    return list(_core.quant_isas())


class QuantizedLinear:
    """One projection over quantized weight parts; the interface of
    ``models.linear.Linear`` (``__call__``, ``add_to``).

    Args:
        parts: weights ``[N_i, K]`` with one ``K``; the projection has
            ``N = sum(N_i)`` output features, in the parts' order.
        bias: ``[N]`` or None.
        isa: the kernel variant (one of ``quant_isas()``), None for the
            fastest; every variant gives the same bits.
        activations: "int16" or "int8" (``ACTIVATION_QUANTIZATIONS``); an
            attribute, which may be set later.

    Raises:
        ValueError: no parts, parts of different input features, a ``K``
            the kernels cannot run (not a multiple of 32), an ``isa``
            this CPU does not run, or another ``activations``.
    """

    def __init__(
        self,
        parts: Sequence[QuantizedWeight],
        bias: torch.Tensor | None = None,
        *,
        isa: str | None = None,
        activations: str = "int16",
    ) -> None:
        if not parts:
            raise ValueError("a quantized projection needs at least one weight part")
        k = parts[0].shape[1]
        if any(p.shape[1] != k for p in parts):
            shapes = [p.shape for p in parts]
            raise ValueError(f"quantized weight parts of different input features: {shapes}")
        if isa is not None and isa not in quant_isas():
            raise ValueError(f"quantized kernel variant {isa!r} is not one of {quant_isas()}")
        self.parts = tuple(parts)
        self.bias = bias
        self.isa = isa
        self.activations = check_activations(activations)
        self.in_features = k
        self.out_features = sum(p.shape[0] for p in parts)
        self._kernel: _core.QuantWeights | None = None
        if all(p.data.device.type == "cpu" for p in parts):
            self._kernel = _core.QuantWeights([_kernel_part(p) for p in parts], k)

    @property
    def nbytes(self) -> int:
        """Bytes of the quantized parts (and the bias)."""
        bias = 0 if self.bias is None else self.bias.numel() * self.bias.element_size()
        return sum(p.nbytes for p in self.parts) + bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., N]`` of ``x`` ``[..., K]`` (float32 or bfloat16), in ``x``'s dtype."""
        if self._kernel is None or x.device.type != "cpu":
            return self.reference(x)
        if x.dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"quantized projection of {x.dtype} activations (float32, bfloat16)")
        if x.shape[-1] != self.in_features:
            raise ValueError(
                f"quantized projection of {self.in_features} input features got x {tuple(x.shape)}"
            )
        # A decode step makes ~10 calls a layer: 2-D contiguous float32 rows
        # skip the reshapes and copies (each a few microseconds).
        flat = x.dim() == 2 and x.is_contiguous()
        rows = x if flat else x.reshape(-1, self.in_features).contiguous()
        y = torch.empty(rows.shape[0], self.out_features, dtype=torch.float32)
        bits = rows.view(torch.int16) if rows.dtype == torch.bfloat16 else rows
        self._kernel.forward(
            bits.numpy(), y.numpy(), torch.get_num_threads(), self.isa, self.activations
        )
        if self.bias is not None:
            y += self.bias.to(torch.float32)
        if x.dtype != torch.float32:
            y = y.to(x.dtype)
        return y if flat else y.reshape(*x.shape[:-1], self.out_features)

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """The reference math: each part dequantized to float32, ``F.linear``
        in ``x``'s dtype."""
        w = torch.cat([p.dequantize() for p in self.parts]).to(x.device, x.dtype)
        bias = None if self.bias is None else self.bias.to(x.device, x.dtype)
        return F.linear(x, w, bias)

    def add_to(self, residual: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``residual + self(x)``, ``[T, N]``."""
        return residual + self(x)


def _kernel_part(
    p: QuantizedWeight,
) -> tuple[str, npt.NDArray[np.uint8], npt.NDArray[np.float32] | None, int, str]:
    """``(qtype, uint8 data, float32 [N] scales or None, N, layout)`` numpy
    views for ``_core.QuantWeights`` (data ``[N, row_bytes]``, panels
    ``[ceil(N / 16) * 16, row_bytes]``)."""
    data = p.data.contiguous()
    if p.qtype == "int8":
        assert p.scales is not None
        scales = p.scales.to(torch.float32).contiguous().numpy()
        return (p.qtype, data.view(torch.uint8).numpy(), scales, p.shape[0], p.layout)
    return (p.qtype, data.numpy(), None, p.shape[0], p.layout)
