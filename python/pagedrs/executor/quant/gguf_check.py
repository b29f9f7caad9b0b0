"""Checks of a GGUF model's contents before transformers or the loader read it.

``gguf_header`` / ``gguf_split`` refuse a file whose structure is broken.
``check_gguf`` refuses a well-formed file whose values cannot be a model
(each a ``GGUFHeaderError``, a ``ValueError`` naming the file, the key or
tensor, expected and found), reading no more than it needs:

- the vocabulary: ``tokenizer.ggml.tokens`` must have one entry per row of
  ``token_embd.weight`` (and of ``output.weight``), as llama.cpp requires
  (``n_vocab`` sizes both tensors there), and ``tokenizer.ggml.scores`` /
  ``token_type`` one per token;
- the blocks: ``<arch>.block_count`` must be one more than the largest
  ``blk.N`` of the tensor table, and ``<arch>.embedding_length`` the row
  length of ``token_embd.weight``;
- the values: the float16 scales of every block of the block types pagedrs
  runs (``SCALE_OFFSETS``: ``d``, and ``m`` / ``dmin`` where the type has
  one) and every value of an F32 / F16 / BF16 tensor must be finite. A NaN or
  infinite scale makes its whole block NaN or infinite, which no kernel can
  compute with. The check reads the high byte of each block's scales, a
  strided numpy view per tensor (a float16 is infinite or NaN when its
  exponent bits, all in that byte, are all ones).
"""

from __future__ import annotations

import re

import numpy as np

from .gguf_header import GGUFHeaderError, GGUFTensorInfo
from .gguf_split import GGUFModelFile

#: Byte offsets of the float16 scales inside one block of each block type
#: (ggml's ``block_q4_0`` ... ``block_q6_K`` layouts) and the block's bytes.
SCALE_OFFSETS: dict[str, tuple[tuple[int, ...], int]] = {
    "Q4_0": ((0,), 18),
    "Q4_1": ((0, 2), 20),
    "Q5_0": ((0,), 22),
    "Q5_1": ((0, 2), 24),
    "Q8_0": ((0,), 34),
    "Q4_K": ((0, 2), 144),
    "Q5_K": ((0, 2), 176),
    "Q6_K": ((208,), 210),
}

#: Exponent bits of an IEEE half / bfloat16 value; all ones is inf or NaN.
_F16_EXPONENT, _BF16_EXPONENT = 0x7C00, 0x7F80
#: A little-endian half's exponent bits, all in its second (high) byte.
_F16_EXPONENT_HIGH = np.uint8(_F16_EXPONENT >> 8)

_BLOCK = re.compile(r"^blk\.(\d+)\.")


def _first_bad(bad: np.ndarray) -> int | None:
    index = np.flatnonzero(bad)
    return int(index[0]) if index.size else None


def _check_values(model: GGUFModelFile, t: GGUFTensorInfo) -> None:
    """Refuse ``t`` when a block scale (or a float value) is NaN or infinite."""
    raw = model.data(t).reshape(-1).view(np.uint8)
    row_len = t.dims[0]
    if t.type_name in SCALE_OFFSETS:
        offsets, block_bytes = SCALE_OFFSETS[t.type_name]
        blocks = raw.reshape(-1, block_bytes)
        per_row = row_len // (256 if t.type_name.endswith("_K") else 32)  # blocks per row
        for off in offsets:
            high = raw[off + 1 :: block_bytes]  # each scale's high byte: its exponent bits
            bad = _first_bad(np.bitwise_and(high, _F16_EXPONENT_HIGH) == _F16_EXPONENT_HIGH)
            if bad is not None:
                value = blocks[bad, off : off + 2].copy().view("<f2")[0]
                raise GGUFHeaderError(
                    f"{model.path}: tensor {t.name!r} ({t.type_name}) has a non-finite block "
                    f"scale: expected a finite float16 at byte {off} of block {bad % per_row} "
                    f"of row {bad // per_row}, found {value}"
                )
        return
    if t.type_name in ("F16", "BF16"):
        exponent = _F16_EXPONENT if t.type_name == "F16" else _BF16_EXPONENT
        bits = raw.view("<u2")
        bad = _first_bad((bits & exponent) == exponent)
    elif t.type_name == "F32":
        values = raw.view("<f4")
        bad = None if np.isfinite(values).all() else _first_bad(~np.isfinite(values))
    else:
        return
    if bad is not None:
        raise GGUFHeaderError(
            f"{model.path}: tensor {t.name!r} ({t.type_name}): expected finite values, found "
            f"a NaN or infinity at row {bad // row_len}, column {bad % row_len}"
        )


def _check_vocabulary(model: GGUFModelFile, by_name: dict[str, GGUFTensorInfo]) -> None:
    meta = model.metadata
    tokens = meta.get("tokenizer.ggml.tokens")
    if tokens is None:
        return
    for key in ("tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
        if key in meta and meta[key] != tokens:
            raise GGUFHeaderError(
                f"{model.path}: metadata {key!r} has {meta[key]} entries, expected one per "
                f"token of 'tokenizer.ggml.tokens' ({tokens})"
            )
    for name in ("token_embd.weight", "output.weight"):
        t = by_name.get(name)
        if t is not None and len(t.dims) == 2 and t.dims[1] != tokens:
            raise GGUFHeaderError(
                f"{model.path}: the vocabulary 'tokenizer.ggml.tokens' has {tokens} tokens, "
                f"expected one per row of tensor {name!r} ({t.dims[1]} rows)"
            )


def _check_shape_keys(model: GGUFModelFile, by_name: dict[str, GGUFTensorInfo]) -> None:
    meta = model.metadata
    arch = meta.get("general.architecture")
    blocks = {int(m[1]) for t in model.tensors if (m := _BLOCK.match(t.name))}
    key = f"{arch}.block_count"
    if blocks and key in meta and meta[key] != max(blocks) + 1:
        raise GGUFHeaderError(
            f"{model.path}: metadata {key!r} is {meta[key]!r}, but the tensor table holds "
            f"blocks blk.0 to blk.{max(blocks)} (expected {max(blocks) + 1})"
        )
    key = f"{arch}.embedding_length"
    embd = by_name.get("token_embd.weight")
    if embd is not None and key in meta and meta[key] != embd.dims[0]:
        raise GGUFHeaderError(
            f"{model.path}: metadata {key!r} is {meta[key]!r}, expected the row length of "
            f"tensor 'token_embd.weight' ({embd.dims[0]})"
        )


def check_gguf(model: GGUFModelFile, values: bool = True) -> None:
    """Refuse ``model`` when its metadata and tensors cannot make a model
    (module docs); reads the metadata, the tensor table and, with
    ``values``, the block scales and the float tensors.

    Raises:
        GGUFHeaderError: naming the file, the key or tensor, expected and found.
    """
    by_name = {t.name: t for t in model.tensors}
    _check_vocabulary(model, by_name)
    _check_shape_keys(model, by_name)
    if values:
        for t in model.tensors:
            _check_values(model, t)
