"""A GGUF model as one file or as llama.cpp's split parts.

llama.cpp's ``gguf-split`` (and gguf-py's ``GGUFWriter(split_max_tensors=...,
split_max_size=...)``) write a model as ``<prefix>-00001-of-0000N.gguf`` ...
``<prefix>-0000N-of-0000N.gguf``: every part is a whole GGUF file holding some
of the tensors; the first holds all the model's metadata, and each holds the
keys ``split.no`` (its 0-based index), ``split.count`` (N) and
``split.tensors.count`` (the tensors of all parts together). ``read_gguf``
reads the first part's name, finds the others beside it by that pattern, reads
each one's header (``gguf_header.read_header``) and joins their tensor tables,
each tensor's ``part`` naming the file holding its bytes.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .gguf_header import GGUFHeader, GGUFHeaderError, GGUFTensorInfo, read_header

#: llama.cpp's split file name (``llama_split_path``): prefix, 1-based part, count.
SPLIT_NAME = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")

SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS = "split.no", "split.count", "split.tensors.count"


def split_part_path(first: Path, index: int, count: int) -> Path:
    """The path of part ``index`` (0-based) of ``count`` beside ``first``
    (``<prefix>-0000i-of-0000n.gguf``, llama.cpp's naming)."""
    match = SPLIT_NAME.match(first.name)
    prefix = match["prefix"] if match else first.name.removesuffix(".gguf")
    return first.with_name(f"{prefix}-{index + 1:05d}-of-{count:05d}.gguf")


@dataclass(frozen=True)
class GGUFModelFile:
    """A model's GGUF file or its split parts, read (``read_gguf``).

    Attributes:
        path: the file (the first part of a split model).
        parts: each part's header, in ``split.no`` order (one for a whole file).
        tensors: every part's tensor table, in part then file order; a
            tensor's ``part`` indexes ``parts``.
    """

    path: Path
    parts: tuple[GGUFHeader, ...]
    tensors: tuple[GGUFTensorInfo, ...]

    @property
    def metadata(self) -> dict[str, Any]:
        """The model's metadata: the first part's key-value pairs."""
        return self.parts[0].metadata

    @property
    def file_size(self) -> int:
        """Bytes of all parts together."""
        return sum(p.file_size for p in self.parts)

    def data(self, tensor: GGUFTensorInfo) -> np.ndarray:
        """The tensor's bytes, a view of its part's map (``GGUFHeader.data``)."""
        return self.parts[tensor.part].data(tensor)


def _int_key(header: GGUFHeader, key: str) -> int:
    value = header.metadata.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise GGUFHeaderError(
            f"{header.path}: split key {key!r} is {value!r}, expected a non-negative integer"
        )
    return value


def read_gguf(path: Path) -> GGUFModelFile:
    """Read GGUF ``path``, and when its metadata says it is the first of split
    parts (``split.count`` > 1), every part (module docs).

    Raises:
        GGUFHeaderError: a part that is not a readable GGUF (``read_header``);
            ``path`` naming a part other than the first; a part missing from
            the folder (named); a part whose ``split.no`` / ``split.count``
            are not its place in the set, or whose tensors' count differs
            from ``split.tensors.count``; a tensor in two parts.
        OSError: a part cannot be opened.
    """
    path = Path(path)
    first = read_header(path)
    if SPLIT_COUNT not in first.metadata:
        return GGUFModelFile(path, (first,), first.tensors)
    count = _int_key(first, SPLIT_COUNT)
    if count < 1:
        raise GGUFHeaderError(f"{path}: split key 'split.count' is {count}, expected 1 or more")
    number = _int_key(first, SPLIT_NO) if SPLIT_NO in first.metadata else 0
    if number != 0:
        raise GGUFHeaderError(
            f"{path} is part {number + 1} of {count} of a split GGUF (split.no {number}); "
            f"load the first part, {split_part_path(path, 0, count).name}"
        )
    parts = [first]
    for index in range(1, count):
        part_path = split_part_path(path, index, count)
        if not part_path.is_file():
            raise GGUFHeaderError(
                f"{path}: split GGUF part {index + 1} of {count} is missing: no file {part_path}"
            )
        part = read_header(part_path)
        found = (part.metadata.get(SPLIT_NO), part.metadata.get(SPLIT_COUNT))
        if found != (index, count):
            raise GGUFHeaderError(
                f"{part_path}: mismatched split GGUF part: expected split.no {index} of "
                f"split.count {count} (beside {path.name}), found split.no {found[0]!r} of "
                f"split.count {found[1]!r}"
            )
        parts.append(part)
    tensors = tuple(
        dataclasses.replace(t, part=i) if i else t for i, p in enumerate(parts) for t in p.tensors
    )
    expected = _int_key(first, SPLIT_TENSORS) if SPLIT_TENSORS in first.metadata else None
    if expected is not None and expected != len(tensors):
        raise GGUFHeaderError(
            f"{path}: split GGUF of {count} parts holds {len(tensors)} tensors, expected "
            f"split.tensors.count {expected}"
        )
    seen: dict[str, int] = {}
    for t in tensors:
        if t.name in seen:
            raise GGUFHeaderError(
                f"{path}: tensor {t.name!r} is in split parts {seen[t.name] + 1} and {t.part + 1}"
            )
        seen[t.name] = t.part
    return GGUFModelFile(path, tuple(parts), tensors)


def is_split(path: Path) -> bool:
    """Whether GGUF ``path``'s metadata names it part of a split set
    (``split.count`` over 1).

    Raises:
        GGUFHeaderError, OSError: as ``read_header``.
    """
    header = read_header(path)
    try:
        count = header.metadata.get(SPLIT_COUNT, 1)
    finally:
        header.buffer.close()
    return isinstance(count, int) and count > 1
