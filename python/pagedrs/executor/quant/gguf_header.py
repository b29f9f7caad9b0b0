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
kept as its element count. gguf-py's ``GGUFReader`` instead builds numpy views
of every array element (about 20 s for a 128,256-token vocabulary on a loaded
2-core EPYC, against ~0.1 s here); the tensors' bytes are numpy views of the
same map, as ``GGUFReader.tensors[i].data`` gives them.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

#: GGUF versions read (version 1 counted in 32 bits; no current writer emits it).
VERSIONS = (2, 3)

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


class GGUFHeaderError(ValueError):
    """A file that is not a readable GGUF: bad magic or version, or a
    header that runs past the end of the file."""


@dataclass(frozen=True)
class GGUFTensorInfo:
    """One tensor of the table.

    Attributes:
        name: the GGUF tensor name (``blk.0.attn_q.weight``).
        dims: dimensions as the file lists them, the row length first.
        ggml_type: the ggml type id (``gguf.GGMLQuantizationType`` value).
        type_name: that type's name (``Q4_K``), or ``ggml type <id>`` for an
            id gguf-py does not know.
        data_offset: absolute byte offset of the tensor's data in the file.
        n_bytes: bytes of data (0 for a type gguf-py does not know).
    """

    name: str
    dims: tuple[int, ...]
    ggml_type: int
    type_name: str
    data_offset: int
    n_bytes: int


@dataclass(frozen=True)
class GGUFHeader:
    """A GGUF file's key-value metadata and tensor table over one read-only
    memory map (``read_header``).

    Attributes:
        path: the file.
        file_size: its size in bytes.
        metadata: key -> value (int, float, bool, str; an array as its
            element count).
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
        import gguf

        end = tensor.data_offset + tensor.n_bytes
        if end > self.file_size:
            raise GGUFHeaderError(
                f"{self.path}: tensor {tensor.name!r} ({tensor.type_name}, {tensor.n_bytes} "
                f"bytes at offset {tensor.data_offset}) runs past the end of the file "
                f"({self.file_size} bytes)"
            )
        raw = np.frombuffer(self.buffer, np.uint8, tensor.n_bytes, tensor.data_offset)
        rows = tuple(reversed(tensor.dims[1:]))
        qtype = gguf.GGMLQuantizationType(tensor.ggml_type)
        if qtype == gguf.GGMLQuantizationType.F32:
            return raw.view(np.float32).reshape(*rows, tensor.dims[0])
        if qtype == gguf.GGMLQuantizationType.F16:
            return raw.view(np.float16).reshape(*rows, tensor.dims[0])
        return raw.reshape(*rows, -1)


class _Cursor:
    """Reads GGUF values forward from a buffer, refusing any read past its end."""

    def __init__(self, buf: mmap.mmap, path: Path) -> None:
        self.buf, self.path, self.pos, self.size = buf, path, 0, len(buf)

    def values(self, fmt: str) -> tuple[Any, ...]:
        width = struct.calcsize(fmt)
        if self.pos + width > self.size:
            raise GGUFHeaderError(f"{self.path}: the header runs past the end of the file")
        out = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += width
        return out

    def unpack(self, fmt: str) -> Any:
        out = self.values(fmt)
        return out[0] if len(out) == 1 else out

    def skip(self, n: int) -> None:
        if n < 0 or self.pos + n > self.size:
            raise GGUFHeaderError(f"{self.path}: the header runs past the end of the file")
        self.pos += n

    def string(self) -> str:
        n = self.unpack("<Q")
        start = self.pos
        self.skip(n)
        try:
            return self.buf[start : self.pos].decode("utf-8")
        except UnicodeDecodeError as e:
            raise GGUFHeaderError(f"{self.path}: a header string is not UTF-8 ({e})") from e

    def value(self, kind: int) -> Any:
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            element, count = self.unpack("<IQ")
            if element in _SCALARS:
                self.skip(count * struct.calcsize(_SCALARS[element]))
            elif element == _STRING:
                for _ in range(count):
                    self.skip(self.unpack("<Q"))
            else:
                raise GGUFHeaderError(f"{self.path}: an array of value type {element}")
            return count
        raise GGUFHeaderError(f"{self.path}: unknown metadata value type {kind}")


def read_header(path: Path) -> GGUFHeader:
    """Map ``path`` read-only and read its metadata and tensor table (module
    docs); no tensor data is read.

    Raises:
        GGUFHeaderError: a file that is not GGUF (magic), a version other than
            ``VERSIONS``, a big-endian file, a header that runs past the end
            of the file or holds unknown value types, or a tensor whose rows
            are not whole blocks of its type (naming the tensor and type).
        OSError: the file cannot be opened.
    """
    path = Path(path)
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        if size < 24:
            raise GGUFHeaderError(f"{path}: {size} bytes, shorter than a GGUF header")
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        metadata, tensors = _read_tables(_Cursor(buf, path))
    except BaseException:
        buf.close()
        raise
    return GGUFHeader(path, size, metadata, tensors, buf)


def _read_tables(cur: _Cursor) -> tuple[dict[str, Any], tuple[GGUFTensorInfo, ...]]:
    """The metadata and tensor table from the start of the file."""
    import gguf

    path = cur.path
    if cur.unpack("<4s") != b"GGUF":
        raise GGUFHeaderError(f"{path}: no GGUF magic")
    version = cur.unpack("<I")
    if version not in VERSIONS:
        raise GGUFHeaderError(f"{path}: GGUF version {version} (read: {VERSIONS}, little-endian)")
    n_tensors, n_kv = cur.unpack("<QQ")
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string()
        metadata[key] = cur.value(cur.unpack("<I"))
    table = []
    for _ in range(n_tensors):
        name = cur.string()
        n_dims = cur.unpack("<I")
        dims = tuple(int(d) for d in cur.values(f"<{n_dims}Q"))
        ggml_type, offset = cur.unpack("<IQ")
        table.append((name, dims, ggml_type, offset))
    alignment = int(metadata.get("general.alignment", 32))
    if alignment <= 0 or alignment & (alignment - 1):
        raise GGUFHeaderError(f"{path}: general.alignment {alignment} is not a power of two")
    data_start = -(-cur.pos // alignment) * alignment
    tensors = []
    for name, dims, ggml_type, offset in table:
        try:
            qtype = gguf.GGMLQuantizationType(ggml_type)
        except ValueError:
            type_name, n_bytes = f"ggml type {ggml_type}", 0
        else:
            block, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
            type_name = qtype.name
            if not dims or dims[0] % block:
                raise GGUFHeaderError(
                    f"{path}: tensor {name!r} ({type_name}) has rows of {dims[:1]} values, "
                    f"not a whole number of {block}-value blocks"
                )
            n_bytes = int(np.prod(dims, dtype=np.int64)) // block * block_bytes
        tensors.append(
            GGUFTensorInfo(name, dims, ggml_type, type_name, data_start + offset, n_bytes)
        )
    return metadata, tuple(tensors)
