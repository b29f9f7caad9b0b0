"""The projection wrappers that add an adapter's product beside the base
projection: ``LoRAProjection`` over pagedrs' own fused projections (q/k/v
and gate/up rows of one matrix, float or GGUF-quantized) and
``LoRAModule`` in the place of an HF model's ``nn.Linear`` (or its
batch-invariant / quantized stand-in).

Each adapted part holds a ``SlotStack``: the ``max_loras`` slots' matrices
padded to ``max_lora_rank``. A step's ``LoRAStep`` says each token's slot
(None: no token has an adapter, and the wrapper is the base projection).
The product is added to the base output as PEFT adds it (``base(x) +
scaling * B(A x)``), then any residual: ``residual + (base(x) + delta)``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch import nn

from .adapter import LoRAWeights
from .kernel import lora_add

__all__ = ["LoRAModule", "LoRAProjection", "LoRAStep", "SlotStack"]


class LoRAStep:
    """The step in flight: ``slots`` int32 ``[T]`` (each token's adapter
    slot, -1 for none), or None when no token has an adapter."""

    def __init__(self) -> None:
        self.slots: npt.NDArray[np.int32] | None = None


class SlotStack:
    """The ``max_loras`` slots of one adapted projection part.

    Args:
        num_slots: ``max_loras``.
        max_rank: ``max_lora_rank``.
        in_features, out_features: the part's shape.

    The matrices (float32 ``[L, R, K]`` and ``[L, N, R]``) are allocated at
    the first adapter that adapts the part.
    """

    def __init__(self, num_slots: int, max_rank: int, in_features: int, out_features: int) -> None:
        self.num_slots, self.max_rank = num_slots, max_rank
        self.in_features, self.out_features = in_features, out_features
        self.lora_a: torch.Tensor | None = None
        self.lora_b: torch.Tensor | None = None
        self.ranks = np.zeros(num_slots, dtype=np.int32)
        self.scalings = np.zeros(num_slots, dtype=np.float32)

    @property
    def active(self) -> bool:
        """Whether a slot holds an adapter of this part."""
        return self.lora_a is not None and bool(self.ranks.any())

    @property
    def nbytes(self) -> int:
        """Bytes of the slot matrices (0 before the first adapter)."""
        if self.lora_a is None or self.lora_b is None:
            return 0
        return 4 * (self.lora_a.numel() + self.lora_b.numel())

    def set(self, slot: int, weights: LoRAWeights | None, scaling: float) -> None:
        """Put an adapter's matrices of this part in ``slot`` (None: the
        adapter does not adapt it, the slot's rank becomes 0)."""
        if weights is None:
            self.ranks[slot] = 0
            return
        if self.lora_a is None or self.lora_b is None:
            k, n, r, s = self.in_features, self.out_features, self.max_rank, self.num_slots
            self.lora_a = torch.zeros(s, r, k, dtype=torch.float32)
            self.lora_b = torch.zeros(s, n, r, dtype=torch.float32)
        rank = weights.rank
        self.lora_a[slot].view(-1)[: rank * self.in_features].copy_(weights.lora_a.reshape(-1))
        self.lora_b[slot].view(-1)[: self.out_features * rank].copy_(weights.lora_b.reshape(-1))
        self.ranks[slot] = rank
        self.scalings[slot] = scaling

    def apply(
        self, x: torch.Tensor, out: torch.Tensor, col: int, slots: npt.NDArray[np.int32]
    ) -> None:
        """``out[t, col : col + N] += product`` for every token of an adapter
        that adapts this part (``kernel.lora_add``)."""
        if self.lora_a is None or self.lora_b is None or not self.ranks.any():
            return
        lora_add(x, out, slots, self.lora_a, self.lora_b, self.ranks, self.scalings, col)


def _add_products(
    x: torch.Tensor,
    y: torch.Tensor,
    parts: list[tuple[SlotStack, int]],
    slots: npt.NDArray[np.int32],
) -> torch.Tensor:
    """``y`` (``[..., W]``) with each part's products added at its column.

    The products are float32 from the float32 value of ``x``; a bfloat16 or
    float16 ``y`` is widened to float32, the products added there and the sum
    rounded once to ``y``'s dtype: PEFT's order for a half-precision model with
    its adapter in float32 (``result + lora_B(lora_A(x)) * scaling``, then
    ``result.to(dtype)``).
    """
    k = x.shape[-1]
    x32 = x.reshape(-1, k).float().contiguous()
    w = y.shape[-1]
    if y.dtype == torch.float32 and y.is_contiguous():
        target = y.view(-1, w)
        for stack, col in parts:
            stack.apply(x32, target, col, slots)
        return y
    wide = y.reshape(-1, w).to(torch.float32, copy=True).contiguous()
    for stack, col in parts:
        stack.apply(x32, wide, col, slots)
    return wide.view(y.shape).to(y.dtype)


class LoRAProjection:
    """A fused projection of pagedrs' own model code (``models.llama``)
    with adapters: ``__call__`` and ``add_to`` as the base's.

    Args:
        base: the ``Linear`` or ``QuantizedLinear``.
        parts: per fused part, its ``SlotStack`` and first output column.
        step: the engine's ``LoRAStep``.
    """

    def __init__(self, base: Any, parts: list[tuple[SlotStack, int]], step: LoRAStep) -> None:
        self.base = base
        self.parts = parts
        self.step = step

    def __getattr__(self, name: str) -> Any:
        return getattr(self.base, name)

    def _active(self) -> bool:
        """Whether a token of the step may have an adapter of a part."""
        return self.step.slots is not None and any(stack.active for stack, _ in self.parts)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``base(x)`` plus each token's adapter product, ``[T, out]``."""
        y = self.base(x)
        slots = self.step.slots
        if slots is None or not self._active():
            return y
        return _add_products(x, y, self.parts, slots)

    def add_to(self, residual: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``residual + self(x)`` (the base's fused form when no slot holds an
        adapter of this projection or no token of the step has one)."""
        if not self._active():
            return self.base.add_to(residual, x)
        return residual + self(x)


class LoRAModule(nn.Module):
    """An HF projection module with adapters, in the module's place.

    Args:
        base: the ``nn.Linear`` (or the module standing in for it).
        stack: its ``SlotStack``.
        step: the engine's ``LoRAStep``.
    """

    def __init__(self, base: nn.Module, stack: SlotStack, step: LoRAStep) -> None:
        super().__init__()
        self.base = base
        self.stack = stack
        self.step = step
        self.in_features = stack.in_features
        self.out_features = stack.out_features

    @property
    def weight(self) -> Any:
        """The base module's weight."""
        return self.base.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        slots = self.step.slots
        if slots is None or not self.stack.active:
            return y
        return _add_products(x, y, [(self.stack, 0)], slots)
