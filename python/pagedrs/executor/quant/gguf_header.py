"""The tensor table of a GGUF file, read in one pass over a memory map.

GGUF (ggml's format, ``docs/gguf.md`` in llama.cpp): the magic ``GGUF``, a
``uint32`` version (2 or 3), ``uint64`` tensor and key-value counts, the
key-value pairs (a key string, a ``uint32`` value type, the value), then per
tensor its name, ``uint32`` dimension count, ``uint64`` dimensions (the row
length first), ``uint32`` ggml type and ``uint64`` offset into the data
section, which starts at the next multiple of ``general.alignment`` (32 by
default). Strings are a ``uint64`` byte length and UTF-8 bytes; arrays a
``uint32`` element type, a ``uint64`` count and the elements. Little-endian
files only.

``read_header`` walks this with ``struct`` and keeps the scalar and string
values; an array (a tokenizer's vocabulary, merges, scores) is stepped over and
kept as its element count (its strings checked to be UTF-8), or, for the keys
asked for, kept whole (a list of str, or a numpy array of numbers).

A hostile or damaged file is refused by ``GGUFHeaderError`` (a ``ValueError``)
naming the file, the key or tensor, what was expected and what was found,
before anything larger than a header value is allocated: a wrong magic or
version, a header cut short, an unknown metadata or ggml type, a tensor of
more than ``MAX_DIMS`` dimensions or of a zero dimension, rows that are not
whole blocks, an offset not a multiple of ``general.alignment``, a duplicate
name, and a tensor whose bytes (its type's block size times its shape) run
past the end of the file or into the next tensor's.

gguf-py's ``GGUFReader`` instead builds numpy views of every array element
(about 20 s for a 128,256-token vocabulary on a loaded 2-core EPYC, against
~0.3 s here); the tensors' bytes are numpy views of the same map, as
``GGUFReader.tensors[i].data`` gives them.
"""

from __future__ import annotations

import math
import mmap
import os
import struct
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import gguf_parses
from .gguf_parses import Parsed

#: GGUF versions read (version 1 counted in 32 bits; no current writer emits it).
VERSIONS = (2, 3)

#: ggml's largest tensor rank (``GGML_MAX_DIMS``).
MAX_DIMS = 4

#: struct format of each fixed-size metadata value type.
_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9
_U64 = struct.Struct("<Q")


#: ggml type ids of float32 and float16 tensors (the GGUF format's ``ggml_type``).
GGML_F32, GGML_F16 = 0, 1


class GGUFHeaderError(ValueError):
    """A file that is not a readable GGUF (module docs); the message names
    the file, the key or tensor, and what was expected and found."""


@dataclass(frozen=True)
class GGUFTensorInfo:
    """One tensor of the table.

    Attributes:
        name: the GGUF tensor name (``blk.0.attn_q.weight``).
        dims: dimensions as the file lists them, the row length first.
        ggml_type: the ggml type id (``gguf.GGMLQuantizationType`` value).
        type_name: that type's name (``Q4_K``).
        data_offset: absolute byte offset of the tensor's data in its file.
        n_bytes: bytes of data (the type's block bytes times the blocks of
            the shape).
        part: the index of the file holding it among a split model's parts
            (``gguf_split``); 0 for a single file.
    """

    name: str
    dims: tuple[int, ...]
    ggml_type: int
    type_name: str
    data_offset: int
    n_bytes: int
    part: int = 0


@dataclass(frozen=True)
class GGUFHeader:
    """A GGUF file's key-value metadata and tensor table over one read-only
    memory map (``read_header``).

    Attributes:
        path: the file.
        file_size: its size in bytes.
        metadata: key -> value (int, float, bool, str; an array as its
            element count, or, for the keys ``read_header`` was asked to
            keep, a list of str or a 1-D numpy array of its element type).
        tensors: the tensor table, in file order.
        buffer: the file's bytes (a read-only ``mmap``).
    """

    path: Path
    file_size: int
    metadata: dict[str, Any]
    tensors: tuple[GGUFTensorInfo, ...]
    buffer: mmap.mmap

    def data(self, tensor: GGUFTensorInfo) -> np.ndarray:
        """The tensor's bytes as a read-only numpy view of the map, laid out as
        gguf-py's ``ReaderTensor.data``: float32 / float16 with the dims
        reversed for F32 / F16, otherwise uint8 ``[..., row_bytes]`` (the
        blocks of each row; BF16 as 2 bytes per value).

        Raises:
            GGUFHeaderError: the tensor's data runs past the end of the file.
        """
        end = tensor.data_offset + tensor.n_bytes
        if end > self.file_size:
            raise GGUFHeaderError(
                f"{self.path}: tensor {tensor.name!r} ({tensor.type_name}, {tensor.n_bytes} "
                f"bytes at offset {tensor.data_offset}) runs past the end of the file "
                f"({self.file_size} bytes)"
            )
        raw = np.frombuffer(self.buffer, np.uint8, tensor.n_bytes, tensor.data_offset)
        rows = tuple(reversed(tensor.dims[1:]))
        if tensor.ggml_type == GGML_F32:
            return raw.view(np.float32).reshape(*rows, tensor.dims[0])
        if tensor.ggml_type == GGML_F16:
            return raw.view(np.float16).reshape(*rows, tensor.dims[0])
        return raw.reshape(*rows, -1)


class _Cursor:
    """Reads GGUF values forward from a buffer, refusing any read past its end;
    ``what`` names the item being read for the error."""

    def __init__(self, buf: mmap.mmap, path: Path) -> None:
        self.buf, self.path, self.pos, self.size = buf, path, 0, len(buf)
        self.what = "the header"

    def _past_end(self, n: int) -> GGUFHeaderError:
        return GGUFHeaderError(
            f"{self.path}: truncated or corrupt GGUF: {self.what} needs {n} bytes at offset "
            f"{self.pos}, past the end of the file ({self.size} bytes)"
        )

    def values(self, fmt: str) -> tuple[Any, ...]:
        width = struct.calcsize(fmt)
        if self.pos + width > self.size:
            raise self._past_end(width)
        out = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += width
        return out

    def unpack(self, fmt: str) -> Any:
        out = self.values(fmt)
        return out[0] if len(out) == 1 else out

    def skip(self, n: int) -> None:
        if n < 0 or self.pos + n > self.size:
            raise self._past_end(n)
        self.pos += n

    def string(self) -> str:
        n = self.unpack("<Q")
        start = self.pos
        self.skip(n)
        try:
            return self.buf[start : self.pos].decode("utf-8")
        except UnicodeDecodeError as e:
            raise GGUFHeaderError(
                f"{self.path}: corrupt GGUF: {self.what} holds a string at offset {start} "
                f"that is not UTF-8 ({e.reason} at byte {e.start})"
            ) from e

    def strings(self, count: int, keep: bool) -> list[str] | None:
        """``count`` strings from here, each checked to be UTF-8; returned
        when ``keep``. One pass collects the bytes of every string (its
        length read with a precompiled ``struct``); one decode of them all,
        joined by newlines, checks them (a newline ends any multi-byte
        sequence, so each string is checked whole)."""
        buf, pos, size = self.buf, self.pos, self.size
        length = _U64.unpack_from
        pieces: list[bytes] = []
        add = pieces.append
        for _ in range(count):
            if pos + 8 > size:
                self.pos = pos
                raise self._past_end(8)
            (n,) = length(buf, pos)
            pos += 8
            if pos + n > size:
                self.pos = pos
                raise self._past_end(n)
            add(buf[pos : pos + n])
            pos += n
        try:
            out = [p.decode("utf-8") for p in pieces] if keep else None
            if not keep:
                b"\n".join(pieces).decode("utf-8")
        except UnicodeDecodeError:
            for _ in range(count):  # again from the start, one by one: names the string
                self.string()
            raise
        self.pos = pos
        return out

    def value(self, kind: int, keep: bool = False) -> Any:
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            element, count = self.unpack("<IQ")
            if element in _SCALARS:
                width = struct.calcsize(_SCALARS[element])
                start = self.pos
                self.skip(count * width)
                if keep:
                    dtype = np.dtype(_SCALARS[element])
                    return np.frombuffer(self.buf, dtype, count, start).copy()
            elif element == _STRING:
                kept = self.strings(count, keep)
                if kept is not None:
                    return kept
            else:
                raise GGUFHeaderError(
                    f"{self.path}: corrupt GGUF: {self.what} is an array of value type "
                    f"{element} (expected one of {sorted((*_SCALARS, _STRING))})"
                )
            return count
        raise GGUFHeaderError(
            f"{self.path}: corrupt GGUF: {self.what} has value type {kind} "
            f"(expected one of {sorted((*_SCALARS, _STRING, _ARRAY))})"
        )


def read_header(path: str | Path, arrays: Collection[str] = ()) -> GGUFHeader:
    """Map ``path`` read-only and read its metadata and tensor table (module
    docs); no tensor data is read. The arrays of the keys in ``arrays``
    (``tokenizer.ggml.tokens``) are kept: strings as a list of str, numbers
    as a numpy array (a copy). The parse of a file unchanged since (same
    inode, size and modification time) is reused, and, without ``arrays``,
    kept by the store ``gguf_parses.set_parsed_header_store`` gives (pagedrs'
    cache).

    Raises:
        GGUFHeaderError: any of the module docs' refusals, naming the file,
            the key or tensor, expected and found.
        OSError: the file cannot be opened.
    """
    path = Path(path)
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        size = st.st_size
        if size < 24:
            raise GGUFHeaderError(
                f"{path}: {size} bytes, shorter than a GGUF header (24 bytes: magic, "
                "version, tensor and key counts)"
            )
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    key = (os.path.realpath(path), st.st_dev, st.st_ino, st.st_mtime_ns, size, frozenset(arrays))
    try:
        parsed = gguf_parses.parse(key, path, st, buf, frozenset(arrays), _read_tables_of)
    except BaseException:
        buf.close()
        raise
    metadata, tensors = parsed
    return GGUFHeader(path, size, dict(metadata), tensors, buf)


def _read_tables_of(path: Path, buf: mmap.mmap, arrays: frozenset[str]) -> Parsed:
    """The metadata and tensor table of ``path`` (bytes ``buf``), the arrays
    of the keys ``arrays`` kept."""
    return _read_tables(_Cursor(buf, path), arrays)


def _read_tables(cur: _Cursor, arrays: frozenset[str]) -> Parsed:
    """The metadata and tensor table from the start of the file."""
    path = cur.path
    magic = cur.unpack("<4s")
    if magic != b"GGUF":
        raise GGUFHeaderError(f"{path}: no GGUF magic (expected b'GGUF', found {magic!r})")
    version = cur.unpack("<I")
    if version not in VERSIONS:
        raise GGUFHeaderError(
            f"{path}: GGUF version {version} (read: {VERSIONS}, little-endian files only)"
        )
    n_tensors, n_kv = cur.unpack("<QQ")
    metadata: dict[str, Any] = {}
    for i in range(n_kv):
        cur.what = f"metadata key #{i}"
        key = cur.string()
        cur.what = f"metadata key {key!r}"
        metadata[key] = cur.value(cur.unpack("<I"), key in arrays)
    table = []
    for i in range(n_tensors):
        cur.what = f"tensor #{i} of {n_tensors}"
        name = cur.string()
        cur.what = f"tensor {name!r}"
        n_dims = cur.unpack("<I")
        if not 1 <= n_dims <= MAX_DIMS:
            raise GGUFHeaderError(
                f"{path}: corrupt GGUF: tensor {name!r} has {n_dims} dimensions "
                f"(expected 1 to {MAX_DIMS})"
            )
        dims = tuple(int(d) for d in cur.values(f"<{n_dims}Q"))
        ggml_type, offset = cur.unpack("<IQ")
        table.append((name, dims, ggml_type, offset))
    alignment = metadata.get("general.alignment", 32)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise GGUFHeaderError(
            f"{path}: general.alignment is {alignment!r}, expected a power of two"
        )
    data_start = -(-cur.pos // alignment) * alignment
    tensors = tuple(_tensor_info(path, alignment, data_start, *entry) for entry in table)
    _check_extents(path, tensors, cur.size)
    return metadata, tensors


def _tensor_info(
    path: Path,
    alignment: int,
    data_start: int,
    name: str,
    dims: tuple[int, ...],
    ggml_type: int,
    offset: int,
) -> GGUFTensorInfo:
    """One table entry, its type, shape and offset checked."""
    import gguf

    try:
        qtype = gguf.GGMLQuantizationType(ggml_type)
    except ValueError:
        raise GGUFHeaderError(
            f"{path}: tensor {name!r} has ggml type {ggml_type}, which is not a ggml type "
            "(unknown to gguf-py)"
        ) from None
    block, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    where = f"{path}: tensor {name!r} ({qtype.name})"
    if 0 in dims:
        raise GGUFHeaderError(f"{where} has shape {list(dims)}: a zero dimension")
    if dims[0] % block:
        raise GGUFHeaderError(
            f"{where} has rows of {dims[0]} values, not a whole number of {block}-value blocks"
        )
    if offset % alignment:
        raise GGUFHeaderError(
            f"{where}: data offset {offset} is not a multiple of general.alignment {alignment}"
        )
    n_bytes = math.prod(dims) // block * block_bytes
    return GGUFTensorInfo(name, dims, ggml_type, qtype.name, data_start + offset, n_bytes)


def _check_extents(path: Path, tensors: tuple[GGUFTensorInfo, ...], size: int) -> None:
    """Each tensor's bytes lie inside the file and before the next tensor's;
    names are unique."""
    names: set[str] = set()
    for t in tensors:
        if t.name in names:
            raise GGUFHeaderError(f"{path}: tensor {t.name!r} appears twice in the tensor table")
        names.add(t.name)
    ordered = sorted(tensors, key=lambda t: t.data_offset)
    for t, after in zip(ordered, [*ordered[1:], None], strict=False):
        what = (
            f"{path}: tensor {t.name!r} ({t.type_name}, shape {list(t.dims)}) needs "
            f"{t.n_bytes} bytes at offset {t.data_offset}"
        )
        end = t.data_offset + t.n_bytes
        if end > size:
            found = max(size - t.data_offset, 0)
            raise GGUFHeaderError(
                f"{what}, but the file ends after {found} of them ({size} bytes): "
                "truncated or corrupt"
            )
        if after is not None and end > after.data_offset:
            raise GGUFHeaderError(
                f"{what}, but tensor {after.name!r} starts after "
                f"{after.data_offset - t.data_offset} of them: its size does not match its "
                "type and shape"
            )
