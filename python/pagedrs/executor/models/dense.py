"""Batch-invariant float32 projections ``y = x @ W^T (+ b)`` on CPU, in the
Rust kernel ``pagedrs._core.dense_linear`` (``rust/pagedrs-kernels/src/dense``).

torch's float32 ``F.linear`` hands MKL the whole ``[M, K]`` matrix, and MKL
picks its kernel (and so the order of each dot product's additions) by
``M``: a row's last bits differ alone and inside a batch (measured on the
default model's shapes: 0 of 256 rows equal to the row alone). The kernel
here computes every output ``(m, n)`` in one fixed order that depends only
on ``K``: 8 float32 lanes of fused multiply-adds over ``k = l, l + 8, ...``,
the lanes summed in a fixed tree, the tail ``K % 8`` values added in order,
then the bias. Work is split over outputs and rows, never over ``K``. So a
row's bits are the same alone, in a decode step of 16 sequences or in a
speculative verify step of ``K + 1`` tokens, whatever its position, the
thread count or the variant (``dense_isas()``: AVX2 + FMA, portable).

Each call reads the weight in place (``nn.Linear``'s ``[N, K]`` layout) and
streams it once for a block of up to 64 rows (register tiles of 4 rows by 3
outputs, the 3 weight rows kept in L1 while the block's rows pass over
them), so steps of a few rows cost about one row's weight traffic
(``benches/bench_dense_linear.py``).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import torch

import pagedrs._core as _core


def dense_isas() -> list[str]:
    """The dense kernel's variants this CPU runs, fastest first ("avx2",
    "portable"); each gives the same bits."""
    return list(_core.dense_isas())


class DenseWeight:
    """A float32 CPU weight ``[N, K]`` (and bias ``[N]``) the dense kernel
    reads in place.

    Args:
        weight: float32 CPU ``[N, K]``; a non-contiguous one is copied once,
            here (``nn.Linear`` weights and the native model's fused
            matrices are contiguous: no copy).
        bias: float32 CPU ``[N]`` or None.
        isa: the kernel variant (one of ``dense_isas()``), None for the
            fastest; every variant gives the same bits.

    Raises:
        ValueError: a weight or bias that is not a float32 CPU tensor of
            those shapes, or an ``isa`` this CPU does not run.
    """

    def __init__(
        self, weight: torch.Tensor, bias: torch.Tensor | None = None, isa: str | None = None
    ) -> None:
        if weight.dtype != torch.float32 or weight.device.type != "cpu" or weight.dim() != 2:
            raise ValueError(
                f"the dense kernel runs float32 CPU weights [N, K], not {weight.dtype} "
                f"{tuple(weight.shape)} on {weight.device}"
            )
        n = weight.shape[0]
        if bias is not None and (
            bias.dtype != torch.float32 or bias.device.type != "cpu" or tuple(bias.shape) != (n,)
        ):
            raise ValueError(
                f"the dense kernel's bias must be float32 CPU [{n}], not {bias.dtype} "
                f"{tuple(bias.shape)} on {bias.device}"
            )
        if isa is not None and isa not in dense_isas():
            raise ValueError(f"dense kernel variant {isa!r} is not one of {dense_isas()}")
        self.out_features, self.in_features = weight.shape
        self.isa = isa
        self.weight = weight.detach().contiguous()
        self.bias = None if bias is None else bias.detach().contiguous()
        self._w: npt.NDArray[np.float32] = self.weight.numpy()
        self._b: npt.NDArray[np.float32] | None = None if self.bias is None else self.bias.numpy()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """float32 ``[..., N]`` of float32 CPU ``x`` ``[..., K]``.

        Raises:
            ValueError: ``x`` not float32 on CPU, or of other input features.
        """
        if x.dtype != torch.float32 or x.device.type != "cpu":
            raise ValueError(
                f"the dense kernel runs float32 CPU inputs, not {x.dtype} on {x.device}"
            )
        if x.shape[-1] != self.in_features:
            raise ValueError(
                f"dense projection of {self.in_features} input features got x {tuple(x.shape)}"
            )
        rows = x.detach().reshape(-1, self.in_features).contiguous()
        out = torch.empty(rows.shape[0], self.out_features, dtype=torch.float32)
        _core.dense_linear(
            rows.numpy(), self._w, out.numpy(), self._b, torch.get_num_threads(), self.isa
        )
        return out.reshape(*x.shape[:-1], self.out_features)
