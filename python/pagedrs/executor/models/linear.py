"""The projections of the native model: ``x @ W^T (+ b)``, with bfloat16
weights on CPU prepacked once for oneDNN.

torch's ``F.linear`` hands oneDNN a plain row-major bfloat16 weight on every
call. ``torch.ops.mkldnn._reorder_linear_weight`` converts it once, at load,
into the blocked layout oneDNN's bfloat16 GEMM kernels read, and
``torch.ops.mkldnn._linear_pointwise`` runs the GEMM on it (the ops torch's
own compiler uses for frozen CPU weights). Measured on this project's
2-core AVX-512 BF16 machine over the default model's 30 layers and LM head
(weights streamed from memory, ``benches/bench_linear.py``): 1.5-2x faster
at 4-16 tokens per step, 1.2-1.5x at 64, 1.1-1.2x at 256, 1.0-1.1x at 2048,
0.9x at 1 (one row runs as two, below).
The packed weight replaces the plain one (``Linear.release_plain``): the
native model puts a ``PackedRows`` module in the place of each HF projection
it packed, which holds no plain copy and gives the plain rows on demand
(``weight``, ``state_dict``; ``load_state_dict`` repacks), so HF's forward,
tensor-parallel sharding and weight loading keep working on the same
numbers. An LM head tied to the embeddings keeps its plain weight (the
embedding lookup reads it) beside the packed one, as vLLM keeps its CPU
LM head's.

A packed projection gives each row the same bits whatever the number of rows
around it, the batch invariance the attention kernels have by construction:
oneDNN runs one row (a lone sequence's decode step) through another kernel
than two or more, whose sums differ in the last bit for some rows at
K >= 1,536 inputs (measured: 5 of 43 rows of a 1,536 x 576 projection, 10 of
31 of 2,048 x 2,048), while at 2 to 4,096 rows every row's bits equal those
of the same row at any other row count and position (``benches/
bench_invariance.py``). So a single row is computed as two (the row twice)
and the first kept. The price, measured here over the default model's 30
layers and LM head: 8.9 ms against 8.1 ms for one row, paid only by a step
of one sequence.

Float32 weights and other devices keep ``F.linear`` / ``torch.addmm``, the
calls HF's modules make, so float32 outputs keep HF's bits, which are not
batch-invariant (MKL picks its kernel by the row count). With
``batch_invariant=True`` (``EngineArgs.batch_invariant``) float32 CPU
weights run the Rust dense kernel instead (``dense.DenseWeight``: a fixed
reduction order per output); bfloat16 ones must be packed for oneDNN (above);
anything else is refused (``check_batch_invariant``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .dense import DenseWeight


def can_pack(weight: torch.Tensor) -> bool:
    """Whether ``weight`` gets a oneDNN-packed copy: a bfloat16 CPU tensor,
    with torch built with oneDNN, its packing ops present, and a CPU whose
    bfloat16 GEMM oneDNN runs (AVX-512 BW/VL/DQ or AVX-NE-CONVERT; on an
    AVX2-only CPU oneDNN refuses to pack)."""
    return weight.device.type == "cpu" and weight.dtype == torch.bfloat16 and onednn_bf16_packing()


def onednn_bf16_packing() -> bool:
    """Whether this torch and CPU pack bfloat16 weights for oneDNN (the
    conditions of ``can_pack`` other than the weight's own)."""
    return (
        torch.backends.mkldnn.is_available()
        and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


def check_batch_invariant(
    dtype: torch.dtype, device: torch.device, what: str = "the model"
) -> None:
    """Refuse projections that cannot be batch-invariant.

    Float32 on CPU runs the dense kernel; bfloat16 on CPU is invariant where
    oneDNN packs its weights (``onednn_bf16_packing``: AVX-512 BF16 or
    AVX-NE-CONVERT CPUs), not on others.

    Raises:
        ValueError: naming ``batch_invariant``, ``what``, the dtype and the
            device, for anything else.
    """
    if device.type != "cpu":
        raise ValueError(
            f"batch_invariant: {what} on {device}: batch-invariant projections run on CPU only"
        )
    if dtype == torch.float32:
        return
    if dtype == torch.bfloat16 and onednn_bf16_packing():
        return
    if dtype == torch.bfloat16:
        raise ValueError(
            f"batch_invariant: {what}: bfloat16 needs oneDNN's packed bfloat16 GEMM, which "
            "this CPU does not run (AVX-512 BF16 or AVX-NE-CONVERT); use dtype='float32'"
        )
    raise ValueError(
        f"batch_invariant: {what}: {dtype} is not covered (float32, or bfloat16 on CPUs "
        "where oneDNN packs it); use dtype='float32'"
    )


class Linear:
    """One projection ``y = x @ weight^T + bias``.

    Args:
        weight: ``[out_features, in_features]``; a bfloat16 CPU weight is
            packed for oneDNN (``can_pack``), others are used as they are.
        bias: ``[out_features]`` or None.
        pack: False keeps the plain weight whatever its dtype.
        batch_invariant: each row's bits independent of the other rows of
            the call: a float32 CPU weight runs the dense kernel
            (``dense.DenseWeight``), a bfloat16 one must be packed.

    Raises:
        ValueError: ``batch_invariant`` for a weight it cannot hold for
            (``check_batch_invariant``; a bfloat16 weight with ``pack=False``).

    Attributes:
        weight: the plain weight, None once ``release_plain`` dropped it.
        packed: the oneDNN-packed weight, or None.
    """

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        pack: bool = True,
        batch_invariant: bool = False,
    ) -> None:
        self.weight: torch.Tensor | None = weight
        self.bias = bias
        self.out_features, self.in_features = weight.shape
        self.packed: torch.Tensor | None = None
        self.dense: DenseWeight | None = None
        if batch_invariant:
            check_batch_invariant(weight.dtype, weight.device, f"a {tuple(weight.shape)} weight")
            if weight.dtype == torch.float32:
                self.dense = DenseWeight(weight, bias)
            elif not pack:
                raise ValueError("batch_invariant: a bfloat16 weight must be packed (pack=True)")
        if pack and can_pack(weight):
            self.packed = _pack(weight)

    def release_plain(self) -> None:
        """Drop the plain weight, keeping the packed one (its memory is
        freed once nothing else holds it: ``PackedRows`` modules hold none).

        Raises:
            ValueError: the weight is not packed.
        """
        if self.packed is None:
            raise ValueError("a projection without a packed weight keeps its plain one")
        self.weight = None

    def plain_weight(self) -> torch.Tensor:
        """``[out_features, in_features]``: the plain weight held, or, once
        released, one unpacked from the packed weight (a new tensor with the
        same values: the packing reorders them, nothing else)."""
        if self.weight is not None:
            return self.weight
        assert self.packed is not None
        return self.packed.to_dense()

    def load_rows(self, start: int, values: torch.Tensor) -> None:
        """Write ``values`` ``[R, in_features]`` into rows ``start..start + R``
        of the weight (``load_state_dict`` on a ``PackedRows``), repacking it
        when it is packed.

        Raises:
            ValueError: ``values`` of another width, or rows past the end.
        """
        rows = values.shape[0]
        if values.dim() != 2 or values.shape[1] != self.in_features:
            raise ValueError(
                f"rows {tuple(values.shape)} for a projection of {self.in_features} inputs"
            )
        if start < 0 or start + rows > self.out_features:
            raise ValueError(
                f"rows {start}..{start + rows} outside a projection of {self.out_features}"
            )
        plain = self.plain_weight()
        with torch.no_grad():
            plain[start : start + rows] = values.to(plain.dtype)
        if self.packed is not None:
            self.packed = _pack(plain)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``[T, out_features]`` of ``x`` ``[T, in_features]``, in its dtype."""
        if self.dense is not None:
            return self.dense(x)
        if self.packed is not None:
            lone, (x,) = _gemm_rows(x)
            y = torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
            return y[:1] if lone else y
        return F.linear(x, self.plain_weight(), self.bias)

    def add_to(self, residual: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``residual + self(x)`` (``[T, out_features]``). Without a bias the
        GEMM adds the residual as it writes its output (``torch.addmm``, or
        oneDNN's binary-add post-op on a packed weight, which gives
        ``addmm``'s bits): no separate pass, no temporary. The dense kernel
        adds it after (``residual + y``, elementwise: invariant too)."""
        if self.bias is not None or self.dense is not None:
            return residual + self(x)
        if self.packed is not None:
            lone, (x, residual) = _gemm_rows(x, residual)
            y = torch.ops.mkldnn._linear_pointwise.binary(x, residual, self.packed, None, "add")
            return y[:1] if lone else y
        return torch.addmm(residual, x, self.plain_weight().t())


def _pack(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` reordered into oneDNN's blocked layout (a new tensor)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous())


class PackedRows(nn.Module):
    """An HF projection (``nn.Linear``'s interface) over rows ``[start, end)``
    of a packed ``Linear``, in the HF model's place of the module whose
    plain weight the packing replaced: the rows of a fused q/k/v or
    gate/up projection, or a whole projection.

    ``weight`` is the plain ``[end - start, in_features]`` rows, unpacked on
    each access (a new tensor: the values the module had); ``forward`` is
    ``F.linear`` on them, HF's own math. ``state_dict`` holds ``weight``
    (and ``bias``); ``load_state_dict`` writes the rows and repacks.

    Args:
        linear: the packed projection.
        start, end: the rows this module is.
        bias: ``[end - start]`` or None (kept as a parameter).
    """

    def __init__(
        self, linear: Linear, start: int, end: int, bias: torch.Tensor | None = None
    ) -> None:
        super().__init__()
        self.linear = linear
        self.start, self.end = start, end
        self.in_features, self.out_features = linear.in_features, end - start
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)

    @property
    def weight(self) -> torch.Tensor:
        """float ``[out_features, in_features]``, unpacked."""
        return self.linear.plain_weight()[self.start : self.end]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., out_features]`` of ``x`` ``[..., in_features]``."""
        return F.linear(x, self.weight, self.bias)

    def _save_to_state_dict(self, destination: Any, prefix: str, keep_vars: bool) -> None:
        super()._save_to_state_dict(destination, prefix, keep_vars)
        destination[prefix + "weight"] = self.weight

    def _load_from_state_dict(
        self,
        state_dict: Any,
        prefix: str,
        local_metadata: Any,
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )
        key = prefix + "weight"
        if key in unexpected_keys:
            unexpected_keys.remove(key)
        if key not in state_dict:
            if strict:
                missing_keys.append(key)
            return
        value = state_dict[key]
        if tuple(value.shape) != (self.out_features, self.in_features):
            error_msgs.append(
                f"size mismatch for {key}: copying a param with shape {tuple(value.shape)}, "
                f"the shape in current model is {(self.out_features, self.in_features)}"
            )
            return
        self.linear.load_rows(self.start, value)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"rows={self.start}..{self.end} of a packed weight"
        )


def _gemm_rows(*rows: torch.Tensor) -> tuple[bool, tuple[torch.Tensor, ...]]:
    """(lone, tensors): ``[T, N]`` tensors as they are, or for T = 1 each row
    twice (``lone`` True), so that oneDNN runs its GEMM kernel at every row
    count (module docs)."""
    lone = rows[0].shape[0] == 1
    return lone, tuple(t.expand(2, -1) for t in rows) if lone else rows
