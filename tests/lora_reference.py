"""The torch reference of the LoRA kernel ``pagedrs.lora.kernel.lora_add``."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import torch


def lora_add_reference(
    x: torch.Tensor,
    out: torch.Tensor,
    slots: npt.NDArray[np.int32],
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    ranks: npt.NDArray[np.int32],
    scalings: npt.NDArray[np.float32],
    out_col: int = 0,
) -> None:
    """``lora_add`` in plain torch, token by token (same arguments, no ``isa``)."""
    n = lora_b.shape[1]
    for t, s in enumerate(slots.tolist()):
        if s < 0 or ranks[s] == 0:
            continue
        r = int(ranks[s])
        a = lora_a[s].reshape(-1)[: r * x.shape[1]].view(r, x.shape[1])
        b = lora_b[s].reshape(-1)[: n * r].view(n, r)
        out[t, out_col : out_col + n] += (b @ (a @ x[t])) * float(scalings[s])
