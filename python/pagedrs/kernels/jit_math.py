"""Helpers shared by the attention kernels' Triton code: ``LOG2E`` (the
kernels take exponentials base 2, ``exp2(x * log2 e) = exp(x)``), ``tanh`` for
the logit soft cap, and the Triton dtype of each torch compute dtype."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

#: log2(e), for host code.
LOG2E_F = 1.4426950408889634
#: log2(e), readable inside kernels.
LOG2E = tl.constexpr(LOG2E_F)

#: torch compute dtype -> Triton dtype of the kernels' dots.
TL_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


@triton.jit
def tanh(x):  # type: ignore[no-untyped-def]  # Triton JIT: typed at launch
    """``tanh`` from ``exp`` (the interpreter has no libdevice): an odd Taylor
    polynomial near 0, ``(1 - e) / (1 + e)`` with ``e = exp(-2|x|)`` elsewhere;
    both within a few float32 ulps."""
    ax = tl.abs(x)
    e = tl.exp(-2.0 * ax)
    far = (1.0 - e) / (1.0 + e)
    x2 = ax * ax
    near = ax * (1.0 + x2 * (-1.0 / 3.0 + x2 * (2.0 / 15.0 + x2 * (-17.0 / 315.0))))
    t = tl.where(ax < 0.125, near, far)
    return tl.where(x < 0.0, -t, t)
