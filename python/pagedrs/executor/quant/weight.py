"""A projection weight held quantized: the bytes of a GGUF tensor (row-major
blocks, as the file stores them) or int8 values with one scale per output
channel.

A weight of ``N`` output features and ``K`` input features holds ``N`` rows
of ``K`` values. In a GGUF block format each row is ``K / block_size`` blocks
of ``type_size`` bytes (ggml's layout, ``ggml-common.h``), so ``data`` is
uint8 ``[N, K / block_size * type_size]`` and a row's bytes depend on that
row only: rows can be reordered, sliced or sharded whole without touching
the blocks. ``int8`` (``quantization="int8"``) is symmetric per output
channel: ``data`` int8 ``[N, K]``, ``scales`` float32 ``[N]``,
``w[n, k] = data[n, k] * scales[n]``.

Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K
weights also have a panel layout
(``layout="panels"``, ``PANEL_TYPES``): the same blocks rearranged once into
groups of 16 interleaved outputs (``rust/pagedrs-kernels/src/quant/repack.rs``,
``repack5.rs``, ``repack_k.rs``), which
the AVX-512 VNNI kernel reads on int8 activations without decoding them per
call. ``data`` is then uint8 ``[ceil(N / 16) * 16, row_bytes]``, the file's
size up to the last group's padding; ``to_rows`` and ``row_bytes`` give the
file's bytes back.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

import pagedrs._core as _core

# GGUF block formats kept quantized: name -> (values per block, bytes per block).
GGUF_BLOCK_TYPES: dict[str, tuple[int, int]] = {
    "Q4_0": (32, 18),
    "Q4_1": (32, 20),
    "Q5_0": (32, 22),
    "Q5_1": (32, 24),
    "Q8_0": (32, 34),
    "Q4_K": (256, 144),
    "Q5_K": (256, 176),
    "Q6_K": (256, 210),
}
QUANT_TYPES: tuple[str, ...] = (*GGUF_BLOCK_TYPES, "int8")
#: The formats with a panel layout.
PANEL_TYPES: tuple[str, ...] = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")
#: Outputs of a panel group.
PANEL_GROUP = 16
LAYOUTS: tuple[str, ...] = ("rows", "panels")


@dataclass(frozen=True)
class QuantizedWeight:
    """A ``[N, K]`` projection weight in ``qtype`` (one of ``QUANT_TYPES``).

    Attributes:
        qtype: ``"Q4_0"``, ..., ``"Q6_K"`` (GGUF block formats) or ``"int8"``.
        shape: ``(N, K)``: output features, input features.
        data: GGUF formats: uint8 ``[N, row_bytes]`` (panels: ``[ceil(N /
            16) * 16, row_bytes]``); int8: int8 ``[N, K]``. May be a view over
            a memory-mapped file (read-only).
        scales: int8 only: float32 ``[N]``; None for GGUF formats.
        layout: "rows" (the file's) or "panels" (``PANEL_TYPES`` only).
    """

    qtype: str
    shape: tuple[int, int]
    data: torch.Tensor
    scales: torch.Tensor | None = None
    layout: str = "rows"

    def __post_init__(self) -> None:
        n, k = self.shape
        if self.layout not in LAYOUTS:
            raise ValueError(f"quantized weight layout {self.layout!r} is not one of {LAYOUTS}")
        if self.layout == "panels":
            if self.qtype not in PANEL_TYPES:
                raise ValueError(f"{self.qtype} weights have no panel layout ({PANEL_TYPES})")
            block, size = GGUF_BLOCK_TYPES[self.qtype]
            rows = -(-n // PANEL_GROUP) * PANEL_GROUP
            if (
                k % block
                or self.data.dtype != torch.uint8
                or tuple(self.data.shape)
                != (
                    rows,
                    k // block * size,
                )
            ):
                raise ValueError(
                    f"{self.qtype} panels of a [{n}, {k}] weight must be uint8 "
                    f"[{rows}, {k // block * size}]"
                )
            return
        if self.qtype == "int8":
            if self.data.dtype != torch.int8 or tuple(self.data.shape) != (n, k):
                raise ValueError(f"int8 weight data must be int8 [{n}, {k}]")
            if self.scales is None or tuple(self.scales.shape) != (n,):
                raise ValueError(f"int8 weight needs float32 scales [{n}]")
            return
        if self.qtype not in GGUF_BLOCK_TYPES:
            raise ValueError(f"quantized weight type {self.qtype!r} is not one of {QUANT_TYPES}")
        block, size = GGUF_BLOCK_TYPES[self.qtype]
        if k % block:
            raise ValueError(
                f"{self.qtype} weight of {k} input features: not a multiple of {block}"
            )
        if self.data.dtype != torch.uint8 or tuple(self.data.shape) != (n, k // block * size):
            raise ValueError(f"{self.qtype} weight data must be uint8 [{n}, {k // block * size}]")

    @property
    def nbytes(self) -> int:
        """Bytes the weight holds (values, block scales, per-channel scales)."""
        extra = 0 if self.scales is None else self.scales.numel() * self.scales.element_size()
        return self.data.numel() * self.data.element_size() + extra

    def rows(self, start: int, length: int) -> QuantizedWeight:
        """Output features ``start .. start + length`` in the rows layout (a
        view; whole rows; of a panel weight, a copy of the file's bytes)."""
        n, k = self.shape
        if not 0 <= start <= start + length <= n:
            raise ValueError(f"rows {start}..{start + length} outside a weight of {n} rows")
        if self.layout == "panels":
            ids = torch.arange(start, start + length)
            return QuantizedWeight(self.qtype, (length, k), self.row_bytes(ids))
        scales = None if self.scales is None else self.scales[start : start + length]
        return QuantizedWeight(self.qtype, (length, k), self.data[start : start + length], scales)

    def row_bytes(self, ids: torch.Tensor) -> torch.Tensor:
        """The file's bytes of rows ``ids`` (int64 ``[R]``, each in ``0..N``):
        uint8 ``[R, row_bytes]`` (int8: int8 ``[R, K]``), in either layout.

        Raises:
            IndexError: a row outside ``0..N``.
        """
        if self.layout == "rows":
            return self.data[ids]
        n, k = self.shape
        flat = ids.reshape(-1).to(torch.int64).contiguous()
        if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= n):
            raise IndexError(f"row outside a weight of {n} rows")
        out = _core.quant_unpack_rows(self.qtype, self.data.numpy(), n, k, flat.numpy())
        return torch.from_numpy(out)

    def to_panels(self) -> QuantizedWeight:
        """This weight in the panel layout (a new ``[ceil(N / 16) * 16,
        row_bytes]`` array; itself when already in it).

        Raises:
            ValueError: a format without a panel layout (``PANEL_TYPES``) or a
                weight off the CPU.
        """
        if self.layout == "panels":
            return self
        if self.qtype not in PANEL_TYPES:
            raise ValueError(f"{self.qtype} weights have no panel layout ({PANEL_TYPES})")
        if self.data.device.type != "cpu":
            raise ValueError(f"panels of a weight on {self.data.device} (CPU only)")
        n, k = self.shape
        panels = _core.quant_repack(self.qtype, self.data.contiguous().numpy(), k)
        return QuantizedWeight(self.qtype, self.shape, torch.from_numpy(panels), layout="panels")

    def to_rows(self) -> QuantizedWeight:
        """This weight in the file's row layout (a new array from panels;
        itself when already in it)."""
        if self.layout == "rows":
            return self
        return self.rows(0, self.shape[0])

    def dequantize(self) -> torch.Tensor:
        """float32 ``[N, K]``: the reference values (ggml's dequantization
        formulas, ``ggml-quants.c``, bit for bit gguf-py's
        ``quants.dequantize``, computed by ``_core.dequantize``; int8 values
        times their scales; panels read as the file's rows)."""
        if self.layout == "panels":
            return self.to_rows().dequantize()
        if self.qtype == "int8":  # any K
            assert self.scales is not None
            return self.data.to(torch.float32) * self.scales[:, None]
        n, k = self.shape
        data = np.ascontiguousarray(self.data.cpu().numpy()).reshape(n, -1)
        return torch.from_numpy(_core.dequantize(self.qtype, data, None, k))


def quantize_int8(weight: torch.Tensor) -> QuantizedWeight:
    """``weight`` ``[N, K]`` (any float dtype) as symmetric int8 per output
    channel (``quantization="int8"``): ``scales[n] = max_k |w[n, k]| / 127``,
    ``data = round(w / scales[n])`` (ties to even) in ``-127..127``, computed
    in float32; a row of zeros gets scale 0.

    Raises:
        ValueError: ``weight`` not 2-d, or holding NaN or infinity.
    """
    if weight.dim() != 2:
        raise ValueError(f"int8 quantization of a {weight.dim()}-d tensor (a [N, K] weight)")
    w = weight.detach().to(torch.float32)
    if not bool(torch.isfinite(w).all()):
        raise ValueError("int8 quantization of a weight holding NaN or infinity")
    scales = w.abs().amax(dim=1) / 127.0
    inv = torch.where(scales > 0, 1.0 / scales, torch.zeros_like(scales))
    data = torch.round(w * inv[:, None]).clamp_(-127, 127).to(torch.int8)
    return QuantizedWeight("int8", (w.shape[0], w.shape[1]), data.contiguous(), scales)
