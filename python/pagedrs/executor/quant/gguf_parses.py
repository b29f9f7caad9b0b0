"""Parses of GGUF headers kept for later reads (``gguf_header.read_header``).

A load reads the same header several times (checks, config, weights,
special tokens): the last ``_KEEP`` parses stay in this process, keyed by
the file's identity, modification time and the arrays kept, and a parse
without kept arrays also goes to the store ``set_parsed_header_store`` gives
(pagedrs' GGUF cache, ``executor/gguf_cache.py``), which serves it to later
processes. A header's first parse keeps the tokenizer's arrays whatever it
was asked for (``VOCABULARY_ARRAYS``), so that a load walks the vocabulary
once.
"""

from __future__ import annotations

import mmap
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from .gguf_header import GGUFTensorInfo

#: A parse of the metadata and tensor table (arrays as element counts).
Parsed = tuple[dict[str, Any], tuple["GGUFTensorInfo", ...]]


class ParsedHeaderStore(Protocol):
    """Where ``read_header`` keeps parses across processes (``gguf_cache``):
    ``get`` returns the parse of the file ``path`` (``st`` its ``os.stat``,
    ``buf`` its bytes) only when it is the parse of exactly these bytes;
    neither raises."""

    def get(self, path: Path, st: os.stat_result, buf: mmap.mmap) -> Parsed | None: ...

    def put(self, path: Path, st: os.stat_result, buf: mmap.mmap, parsed: Parsed) -> None: ...


_store: ParsedHeaderStore | None = None


def set_parsed_header_store(store: ParsedHeaderStore | None) -> None:
    """Keep parses without kept arrays in ``store`` too (None: in this
    process only)."""
    global _store
    _store = store


#: The tokenizer's arrays (vocabulary, merges, token types): kept by the
#: first parse of a file's header whatever it was asked for (a load reads
#: them next, ``gguf_tokens.TOKENIZER_ARRAYS``), so that its walk over the
#: vocabulary is done once.
VOCABULARY_ARRAYS = frozenset(
    ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type")
)

#: Parsed headers kept (the last ``_KEEP``), keyed by file identity and
#: modification time: a load reads the same header several times (checks,
#: config, weights, special tokens) and parses it once.
_KEEP = 8
_lock = threading.Lock()
_parsed: OrderedDict[tuple[Any, ...], Parsed] = OrderedDict()


def _remember(key: tuple[Any, ...], parsed: Parsed) -> None:
    with _lock:
        _parsed[key] = parsed
        _parsed.move_to_end(key)
        while len(_parsed) > _KEEP:
            _parsed.popitem(last=False)


def _counted(parsed: Parsed, keys: Collection[str]) -> Parsed:
    """``parsed`` with the kept arrays of ``keys`` as their element counts,
    as a parse that did not keep them gives them."""
    metadata, tensors = parsed
    if not any(k in metadata for k in keys):
        return parsed
    out = {
        k: len(v) if k in keys and isinstance(v, list | np.ndarray) else v
        for k, v in metadata.items()
    }
    return out, tensors


def parse(
    key: tuple[Any, ...],
    path: Path,
    st: os.stat_result,
    buf: mmap.mmap,
    arrays: frozenset[str],
    read: Callable[[Path, mmap.mmap, frozenset[str]], Parsed],
) -> Parsed:
    """The parse of ``path`` (``st`` its ``os.stat``, ``buf`` its bytes,
    ``key`` its identity and ``arrays``) with the arrays of ``arrays`` kept:
    kept from before, or from the store, or ``read(path, buf, keep)``.

    Raises:
        whatever ``read`` raises.
    """
    with _lock:
        parsed = _parsed.get(key)
    if parsed is None:
        store = _store if not arrays else None
        parsed = store.get(path, st, buf) if store is not None else None
        if parsed is None:
            # One walk keeps the vocabulary too, for the tokenizer's
            # read of the same file that follows a header's first parse.
            keep = arrays | VOCABULARY_ARRAYS
            full = read(path, buf, keep)
            parsed = _counted(full, keep - arrays)
            if store is not None:
                store.put(path, st, buf, parsed)
            if keep != arrays:
                _remember((*key[:-1], keep), full)
        _remember(key, parsed)
    return parsed
