"""The gathered LoRA product of a step: ``out[t] += scaling_l * (x[t] A_l^T)
B_l^T`` for each token ``t`` with an adapter slot ``l`` (Punica's SGMV), in
the Rust kernel ``pagedrs._core.lora_add`` (``rust/pagedrs-kernels/src/lora``); the
tests hold its torch reference (``tests/lora_reference.py``).

The kernel shrinks and expands per segment of one slot's consecutive tokens
with the dense kernel's tiles (a fixed order of float32 fused multiply-adds
per output), so a token's bits depend on its own row and adapter alone:
alone or in any batch, in every variant (``lora_isas()``).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import torch

import pagedrs._core as _core

__all__ = ["lora_add", "lora_isas"]


def lora_isas() -> list[str]:
    """The LoRA kernel's variants this CPU runs, fastest first."""
    return list(_core.lora_isas())


def lora_add(
    x: torch.Tensor,
    out: torch.Tensor,
    slots: npt.NDArray[np.int32],
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    ranks: npt.NDArray[np.int32],
    scalings: npt.NDArray[np.float32],
    out_col: int = 0,
    isa: str | None = None,
) -> None:
    """Add each token's adapter product to ``out`` in place (Rust kernel).

    Args:
        x: float32 CPU ``[T, K]``, contiguous.
        out: float32 CPU ``[T, W]``, contiguous; columns ``out_col : out_col +
            N`` are added to, rows of tokens without an adapter left alone.
        slots: int32 ``[T]``, each token's slot, -1 for none.
        lora_a: float32 ``[L, R, K]``: slot ``l``'s ``[ranks[l], K]`` A first.
        lora_b: float32 ``[L, N, R]``: slot ``l``'s ``[N, ranks[l]]`` B first.
        ranks: int32 ``[L]`` (0: the slot's adapter does not adapt this part).
        scalings: float32 ``[L]``.
        out_col: the first output column (a fused projection's part).
        isa: a variant of ``lora_isas()``, None for the fastest.
    Raises:
        ValueError: naming the array whose dtype or shape does not match.
    """
    _core.lora_add(
        x.numpy(),
        out.numpy(),
        slots,
        lora_a.numpy(),
        lora_b.numpy(),
        ranks,
        scalings,
        out_col,
        torch.get_num_threads(),
        isa,
    )
