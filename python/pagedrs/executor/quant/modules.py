"""torch modules over quantized weights, put in place of HF's ``nn.Linear``
and ``nn.Embedding`` so that every architecture's own forward runs on them.

``QuantizedLinearModule`` is one ``QuantizedLinear`` (``linear.py``) as an
``nn.Module``: ``forward(x [..., K]) -> [..., N]``. ``QuantizedEmbedding``
looks token rows up in a quantized ``[vocab, hidden]`` weight and
dequantizes only the rows a step reads (an LM head tied to the embeddings
holds the same ``QuantizedWeight``). Neither registers its quantized bytes
as parameters: ``weight_nbytes`` (``memory.py``) counts them.
"""

from __future__ import annotations

import ctypes
import mmap

import torch
from torch import nn

from .experts import QuantizedExperts
from .linear import QuantizedLinear, check_activations, quant_isas
from .weight import PANEL_TYPES, QuantizedWeight


class QuantizedLinearModule(nn.Module):
    """``y = x @ W^T (+ b)`` with ``W`` a ``QuantizedWeight`` ``[N, K]``.

    Args:
        weight: the quantized weight.
        bias: float ``[N]`` or None (kept as a parameter, in the model dtype).

    Attributes:
        qweight: the weight; ``in_features`` ``K``, ``out_features`` ``N``.
        linear: the ``QuantizedLinear`` the forward calls.
        activations: how the forward quantizes its activations ("int16",
            "int8"; ``set_activations``).
    """

    def __init__(self, weight: QuantizedWeight, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.qweight = weight
        self.out_features, self.in_features = weight.shape
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.activations = "int16"
        self.linear = QuantizedLinear([weight], self.bias)

    def set_bias(self, bias: torch.Tensor | None) -> None:
        """Replace the bias (float ``[N]`` or None)."""
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.linear = QuantizedLinear([self.qweight], self.bias, activations=self.activations)

    def set_activations(self, activations: str) -> None:
        """Quantize the activations to ``activations`` ("int16", "int8").

        Raises:
            ValueError: another value.
        """
        self.activations = check_activations(activations)
        self.linear.activations = activations

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., N]`` of ``x`` ``[..., K]`` (float32 or bfloat16), in ``x``'s dtype."""
        lead = x.shape[:-1]
        y = self.linear(x.reshape(-1, self.in_features))
        return y.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return (
            f"in={self.in_features}, out={self.out_features}, qtype={self.qweight.qtype}, "
            f"activations={self.activations}"
        )


def panels_run_here(activations: str) -> bool:
    """Whether the panel layout's kernel runs for ``activations`` on this
    CPU: int8 activations and the AVX-512 VNNI variant among ``quant_isas()``
    (elsewhere panel weights run the portable kernel: the same bits, slower).
    Not on a CPU with AMX: there the file's rows run AMX tiles from 8 rows,
    which the panel kernel (AVX-512 VNNI at every row count) does not."""
    isas = quant_isas()
    return activations == "int8" and "avx512_vnni" in isas and "amx_int8" not in isas


def set_activation_quantization(
    model: nn.Module, activations: str, *, panels: bool | None = None
) -> int:
    """Every ``QuantizedLinearModule`` and ``QuantizedExperts`` (a GGUF MoE
    layer's expert stacks) of ``model`` quantizes its activations to
    ``activations`` ("int16", "int8"); returns how many there are.

    With ``panels`` (None: ``panels_run_here(activations)``) each
    ``QuantizedLinearModule``'s weight of a ``PANEL_TYPES`` format (Q4_0, Q4_1,
    Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K) on CPU is repacked once into the panel layout
    (``QuantizedWeight.to_panels``), otherwise put back in the file's rows;
    a ``QuantizedEmbedding`` holding the same weight (tied embeddings) is
    handed the new one, so that no second copy stays alive.
    The outputs' bits are the same in either layout.

    Raises:
        ValueError: another value.
    """
    check_activations(activations)
    if panels is None:
        panels = panels_run_here(activations)
    kinds = (QuantizedLinearModule, QuantizedExperts)
    modules = [m for m in model.modules() if isinstance(m, kinds)]
    swapped: dict[int, QuantizedWeight] = {}
    files = _file_mappings() if panels else []
    for m in modules:
        if isinstance(m, QuantizedExperts):
            m.set_activations(activations)
            continue
        old = m.qweight
        new = _layout_for(old, panels)
        if new is not old:
            swapped[id(old)] = new
            m.qweight = new
            m.linear = QuantizedLinear([new], m.bias, activations=m.activations)
            page_out(old.data, files)
        m.set_activations(activations)
    for e in model.modules():
        if isinstance(e, QuantizedEmbedding) and id(e.qweight) in swapped:
            e.qweight = swapped[id(e.qweight)]
    return len(modules)


def page_out(t: torch.Tensor, files: list[tuple[int, int]]) -> None:
    """Drop from this process's resident set the whole pages under CPU tensor
    ``t``'s bytes where they lie in one of ``files`` (``_file_mappings``:
    mappings of a file) (``madvise(MADV_DONTNEED)``): a weight read from the
    memory-mapped GGUF and repacked leaves the resident set, so that the
    file's pages and their repacked copy do not add up, while the pages stay
    in the page cache for the next load (a later read of ``t`` faults them
    back in, unchanged). Memory of no file (anonymous: a gathered or
    converted copy, whose contents ``MADV_DONTNEED`` would discard) is left
    as it is, and so is everything where the call is not available."""
    if t.device.type != "cpu" or t.numel() == 0:
        return
    page = mmap.PAGESIZE
    start = t.data_ptr()
    end = start + t.numel() * t.element_size()
    lo, hi = -(-start // page) * page, end // page * page
    if hi <= lo or not any(a <= lo and hi <= b for a, b in files):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), _MADV_DONTNEED)
    except (OSError, AttributeError):
        return


def _file_mappings() -> list[tuple[int, int]]:
    """The address ranges ``[lo, hi)`` of this process's mappings of a file
    (an inode other than 0 in ``/proc/self/maps``); none where it cannot be
    read."""
    out = []
    try:
        with open("/proc/self/maps", encoding="ascii", errors="replace") as f:
            for line in f:
                fields = line.split()
                if len(fields) >= 6 and fields[4] != "0":
                    a, _, b = fields[0].partition("-")
                    out.append((int(a, 16), int(b, 16)))
    except (OSError, ValueError):
        return []
    return out


#: ``MADV_DONTNEED`` (Linux).
_MADV_DONTNEED = getattr(mmap, "MADV_DONTNEED", 4)


def _layout_for(weight: QuantizedWeight, panels: bool) -> QuantizedWeight:
    """``weight`` in the panel layout when ``panels`` and it has one (on
    CPU), else in the file's rows."""
    if panels and weight.qtype in PANEL_TYPES and weight.data.device.type == "cpu":
        return weight.to_panels()
    return weight.to_rows()


def lookup_rows(weight: QuantizedWeight, ids: torch.Tensor) -> torch.Tensor:
    """float32 ``[*ids.shape, K]``: rows ``ids`` of ``weight`` ``[N, K]``,
    each distinct row dequantized once (the rows' blocks are gathered, from
    either layout, then ``QuantizedWeight.dequantize``)."""
    flat = ids.reshape(-1).to(torch.int64).cpu()
    unique, inverse = torch.unique(flat, return_inverse=True)
    scales = None if weight.scales is None else weight.scales[unique]
    rows = QuantizedWeight(
        weight.qtype, (len(unique), weight.shape[1]), weight.row_bytes(unique), scales
    )
    values = rows.dequantize()[inverse]
    return values.reshape(*ids.shape, weight.shape[1])


class QuantizedEmbedding(nn.Module):
    """Token embeddings looked up in a quantized ``[vocab, hidden]`` weight.

    Args:
        weight: ``[vocab, hidden]``.
        dtype: the output dtype (the model's).
        embed_scale: a factor the architecture multiplies embeddings by
            (Gemma's ``sqrt(hidden)``, as HF's scaled embedding computes it:
            the product in the output dtype), or None.

    Raises:
        IndexError: a token id outside ``[0, vocab)``.
    """

    def __init__(
        self,
        weight: QuantizedWeight,
        dtype: torch.dtype,
        embed_scale: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        self.qweight = weight
        self.num_embeddings, self.embedding_dim = weight.shape
        self.dtype = dtype
        self.embed_scale = embed_scale

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """``[*input_ids.shape, hidden]`` in the model dtype."""
        if input_ids.numel() and (
            int(input_ids.min()) < 0 or int(input_ids.max()) >= self.num_embeddings
        ):
            raise IndexError(f"token id outside the vocabulary of {self.num_embeddings}")
        rows = lookup_rows(self.qweight, input_ids).to(input_ids.device, self.dtype)
        if self.embed_scale is not None:
            return rows * self.embed_scale.to(self.dtype)
        return rows

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, qtype={self.qweight.qtype}"
