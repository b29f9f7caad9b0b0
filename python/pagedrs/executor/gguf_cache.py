"""The config and tokenizer of a GGUF file, built once and kept in pagedrs'
cache.

transformers builds both from the file's metadata in Python (its GGUF reader
parses every vocabulary entry, its converter makes the tokenizer from the
tokens and merges): seconds for a 128k-token vocabulary, at every load. Both
depend on the file's header only (the key-value metadata and the tensor
table, the bytes before the tensor data), so they are saved once, with
``save_pretrained``, under ``<cache_dir>/gguf-meta/<sha256 of those bytes>/``
(``config/`` and ``tokenizer/``), and later loads of any file with the same
header read them back (``from_pretrained`` of the folder: the tokenizer's
``tokenizer.json`` is read by ``tokenizers`` in Rust). The key is the bytes
themselves, so an edited header is a new entry, never a stale one.

A cache that cannot be written (read-only, full) is skipped: the load goes
on with what transformers built. ``PAGEDRS_GGUF_CACHE=0`` turns the cache off.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .model_registry import cache_dir
from .quant.gguf_header import read_header

logger = logging.getLogger(__name__)

#: Subfolder of ``model_registry.cache_dir()`` holding the entries.
SUBDIR = "gguf-meta"


def enabled() -> bool:
    """Whether the cache is on (``PAGEDRS_GGUF_CACHE`` is not ``0``)."""
    return os.environ.get("PAGEDRS_GGUF_CACHE", "1").strip() != "0"


def header_digest(path: Path) -> str:
    """SHA-256 (hex) of GGUF ``path``'s header: every byte before its first
    tensor's data (the whole file when it has no tensors).

    Raises:
        ValueError: a file ``gguf_header.read_header`` refuses.
    """
    header = read_header(path)
    try:
        end = min((t.data_offset for t in header.tensors), default=header.file_size)
        return hashlib.sha256(memoryview(header.buffer)[:end]).hexdigest()
    finally:
        header.buffer.close()


def entry(path: Path, kind: str) -> Path:
    """The cache folder of ``kind`` (``config`` or ``tokenizer``) for GGUF ``path``."""
    return cache_dir() / SUBDIR / header_digest(path) / kind


def _save(folder: Path, save: Callable[[Path], None]) -> None:
    tmp = folder.with_name(f"{folder.name}.tmp-{os.getpid()}")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        save(tmp)
        os.replace(tmp, folder)
    except OSError as e:  # another process saved it first, or the cache is read-only
        logger.info("GGUF metadata cache: not saved at %s (%s)", folder, e)
        shutil.rmtree(tmp, ignore_errors=True)


def cached(path: Path, kind: str, build: Callable[[], Any], load: Callable[[Path], Any]) -> Any:
    """``load(folder)`` of the cache entry of ``kind`` for GGUF ``path``;
    without one, ``build()`` and save it there (``save_pretrained``).

    Raises:
        ValueError: from ``header_digest``, ``build`` or ``load``.
    """
    if not enabled():
        return build()
    folder = entry(path, kind)
    if folder.is_dir():
        return load(folder)
    built = build()
    _save(folder, built.save_pretrained)
    return built


#: Classes ``load_tokenizer_folder`` builds directly: transformers' plain
#: ``tokenizers``-backed class under its two names.
_PLAIN_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")
_NOT_KWARGS = ("backend", "is_local", "local_files_only", "tokenizer_class", "added_tokens_decoder")


def load_tokenizer_folder(folder: Path) -> Any:
    """The tokenizer saved in cache ``folder``. A plain ``tokenizers``-backed
    one (``tokenizer_class`` ``TokenizersBackend``) is made directly from
    ``tokenizer.json`` with the saved special tokens and chat template
    (``AutoTokenizer.from_pretrained`` takes ~4x as long on a vocabulary with
    many added tokens); another class through ``AutoTokenizer``."""
    import json

    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    config = json.loads((folder / "tokenizer_config.json").read_text())
    if config.get("tokenizer_class") not in _PLAIN_CLASSES:
        return AutoTokenizer.from_pretrained(folder)
    kwargs = {k: v for k, v in config.items() if k not in _NOT_KWARGS}
    tok = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"), **kwargs)
    template = folder / "chat_template.jinja"
    if template.exists():
        tok.chat_template = template.read_text()
    return tok
