"""A projection ``y = x @ W^T (+ b)`` whose weight stays quantized.

``W`` is one or more ``QuantizedWeight`` parts stacked along the output
features: a fused projection (q/k/v, gate/up) whose parts a GGUF file stores
in different formats (Q4_K_M keeps some in Q6_K) is one call over its parts,
its output the parts' outputs side by side.

The reference computation here dequantizes each part to float32 for the call
(``QuantizedWeight.dequantize``) and runs ``F.linear``; it is the math the
Rust kernels are checked against.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from .weight import QuantizedWeight


class QuantizedLinear:
    """One projection over quantized weight parts; the interface of
    ``models.linear.Linear`` (``__call__``, ``add_to``).

    Args:
        parts: weights ``[N_i, K]`` with one ``K``; the projection has
            ``N = sum(N_i)`` output features, in the parts' order.
        bias: ``[N]`` or None.

    Raises:
        ValueError: no parts, or parts of different input features.
    """

    def __init__(self, parts: Sequence[QuantizedWeight], bias: torch.Tensor | None = None) -> None:
        if not parts:
            raise ValueError("a quantized projection needs at least one weight part")
        k = parts[0].shape[1]
        if any(p.shape[1] != k for p in parts):
            shapes = [p.shape for p in parts]
            raise ValueError(f"quantized weight parts of different input features: {shapes}")
        self.parts = tuple(parts)
        self.bias = bias
        self.in_features = k
        self.out_features = sum(p.shape[0] for p in parts)

    @property
    def nbytes(self) -> int:
        """Bytes of the quantized parts (and the bias)."""
        bias = 0 if self.bias is None else self.bias.numel() * self.bias.element_size()
        return sum(p.nbytes for p in self.parts) + bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``[T, N]`` of ``x`` ``[T, K]`` (float32 or bfloat16), in ``x``'s dtype."""
        w = torch.cat([p.dequantize() for p in self.parts]).to(x.dtype)
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return F.linear(x, w, bias)

    def add_to(self, residual: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``residual + self(x)``, ``[T, N]``."""
        return residual + self(x)
