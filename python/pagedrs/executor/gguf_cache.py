"""What a load derives from a GGUF file's header, built once and kept in
pagedrs' cache.

The config, the tokenizer and the special tokens of a GGUF file depend on
its header only (the key-value metadata and the tensor table, the bytes
before the tensor data); building them reads every vocabulary entry (a
tokenizer is seconds of Python for a 128k-token vocabulary). They are saved
once under ``<cache_dir>/gguf-meta/<sha256 of those bytes>/`` (``config/``
and ``tokenizer/`` as ``save_pretrained`` writes them, ``special_tokens.json``)
and later loads of any file with the same header read them back
(``from_pretrained`` of the folder: the tokenizer's ``tokenizer.json`` is read
by ``tokenizers`` in Rust). The key is the bytes themselves, so an edited
header is a new entry, never a stale one.

The check of the tensors' values (``quant.gguf_check``: every block scale
finite), which reads a strided sample of the whole file, is remembered the
same way, per file: an empty marker named by the file's size, modification
time (ns) and inode (every part's, for a split model) under the header's
entry. A file written since has another modification time and is checked
again. The check that the config's model has no more parameters than the
tensors hold (``gguf_checks.check_gguf_config``, which builds the model on
the meta device) is remembered the same way under ``config-checked/``, the marker
named by the files' identities, the transformers version and the config.

The parse of the header itself (``gguf_header.read_header``: the walk over
every vocabulary string to find the tensor table) is kept too, as
``<digest>/header.json``, found from the file's identity (path, device,
inode, size, modification time: ``files/<hash>.json``, which also holds the
header's length) and used only when the file's header bytes hash to the
digest (``HeaderStore``).

A cache that cannot be written (read-only, full) is skipped: the load goes
on with what it built. ``PAGEDRS_GGUF_CACHE=0`` turns the cache off.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .model_registry import cache_dir
from .quant.gguf_header import GGUFTensorInfo, read_header
from .quant.gguf_parses import Parsed, set_parsed_header_store

logger = logging.getLogger(__name__)

#: Subfolder of ``model_registry.cache_dir()`` holding the entries.
SUBDIR = "gguf-meta"


def enabled() -> bool:
    """Whether the cache is on (``PAGEDRS_GGUF_CACHE`` is not ``0``)."""
    return os.environ.get("PAGEDRS_GGUF_CACHE", "1").strip() != "0"


def header_digest(path: Path) -> str:
    """SHA-256 (hex) of GGUF ``path``'s header: every byte before its first
    tensor's data (the whole file when it has no tensors). Kept per file
    identity (path, inode, size, modification time) for later calls.

    Raises:
        ValueError: a file ``gguf_header.read_header`` refuses.
    """
    key = _file_key(path, os.stat(path))
    digest = _digests.get(key)
    if digest is not None:
        return digest
    header = read_header(path)
    try:
        end = min((t.data_offset for t in header.tensors), default=header.file_size)
        digest = hashlib.sha256(memoryview(header.buffer)[:end]).hexdigest()
    finally:
        header.buffer.close()
    if len(_digests) >= _KEEP:
        _digests.clear()
    _digests[key] = digest
    return digest


def _file_key(path: Path, st: os.stat_result) -> tuple[Any, ...]:
    """A file's identity: its real path, device, inode, size, modification time."""
    return (os.path.realpath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


#: Digests of recently read files (``header_digest``), at most ``_KEEP``.
_KEEP = 64
_digests: dict[tuple[Any, ...], str] = {}


def entry(path: Path, kind: str) -> Path:
    """The cache entry ``kind`` (``config``, ``tokenizer``, ...) for GGUF ``path``."""
    return cache_dir() / SUBDIR / header_digest(path) / kind


def _save(folder: Path, save: Callable[[Path], Any]) -> None:
    """Run ``save(tmp)`` into a fresh folder beside ``folder`` and move it
    there."""
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


def cached_files(
    path: Path,
    kind: str,
    write: Callable[[Path], bool],
    load: Callable[[Path], Any],
    build: Callable[[], Any],
) -> Any:
    """``load(folder)`` of the cache entry of ``kind`` for GGUF ``path``;
    without one, ``write(folder)`` writes its files into a fresh folder
    (True), which is loaded and then kept as the entry, or declines (False)
    and ``build()`` makes the object, saved with ``save_pretrained``. Written
    files whose ``load`` raises are dropped and ``build()`` is used. Without a
    writable cache the files are written to a temporary folder.

    Raises:
        ValueError: from ``header_digest`` or ``build``.
    """
    folder = entry(path, kind) if enabled() else None
    if folder is not None and folder.is_dir():
        return load(folder)
    with tempfile.TemporaryDirectory(prefix="pagedrs-gguf-") as scratch:
        tmp = Path(scratch) / kind
        if folder is not None:
            try:  # beside the entry, to be renamed into it
                tmp = folder.with_name(f"{folder.name}.tmp-{os.getpid()}")
                shutil.rmtree(tmp, ignore_errors=True)
                tmp.mkdir(parents=True)
            except OSError:
                tmp = Path(scratch) / kind
        tmp.mkdir(exist_ok=True)
        try:
            out = load(tmp) if write(tmp) else None
        except Exception as e:  # noqa: BLE001 - tokenizers raises a plain Exception
            logger.info("GGUF metadata cache: %s not loaded (%s); building it", tmp, e)
            out = None
        if out is not None and folder is not None and tmp.parent == folder.parent:
            try:
                os.replace(tmp, folder)
            except OSError as e:  # another process saved it first
                logger.info("GGUF metadata cache: not saved at %s (%s)", folder, e)
        shutil.rmtree(tmp, ignore_errors=True)
    if out is not None:
        return out
    built = build()
    if folder is not None:
        _save(folder, built.save_pretrained)
    return built


def cached_json(path: Path, name: str, build: Callable[[], Any]) -> Any:
    """The JSON value ``name`` of GGUF ``path``'s cache entry; without one,
    ``build()`` and save it there.

    Raises:
        ValueError: from ``header_digest`` or ``build``.
    """
    if not enabled():
        return build()
    file = entry(path, f"{name}.json")
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        pass
    value = build()
    try:
        _write_json(file, value)
    except OSError as e:
        logger.info("GGUF metadata cache: %s not saved (%s)", file, e)
    return value


def _identity_file(path: Path, st: os.stat_result) -> Path:
    ident = "|".join(map(str, _file_key(path, st)))
    name = hashlib.sha256(ident.encode()).hexdigest()[:32]
    return cache_dir() / SUBDIR / "files" / f"{name}.json"


class HeaderStore:
    """``gguf_header``'s parses kept in the cache (module docs): per file
    identity (path, device, inode, size, modification time) the header's
    length and digest, ``files/<hash of the identity>.json``; per digest the
    parse, ``<digest>/header.json`` (the metadata with arrays as their
    counts, and the tensor table). A parse is returned only when the file's
    header bytes hash to its digest."""

    def get(self, path: Path, st: os.stat_result, buf: Any) -> Parsed | None:
        if not enabled():
            return None
        try:
            index = json.loads(_identity_file(path, st).read_text(encoding="utf-8"))
            end, digest = int(index["end"]), str(index["digest"])
            if end > len(buf) or hashlib.sha256(memoryview(buf)[:end]).hexdigest() != digest:
                return None
            data = json.loads((cache_dir() / SUBDIR / digest / "header.json").read_text("utf-8"))
            tensors = tuple(
                GGUFTensorInfo(name, tuple(dims), kind, type_name, offset, n_bytes)
                for name, dims, kind, type_name, offset, n_bytes in data["tensors"]
            )
            _digests[_file_key(path, st)] = digest
            return dict(data["metadata"]), tensors
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def put(self, path: Path, st: os.stat_result, buf: Any, parsed: Parsed) -> None:
        if not enabled():
            return
        metadata, tensors = parsed
        end = min((t.data_offset for t in tensors), default=st.st_size)
        digest = hashlib.sha256(memoryview(buf)[:end]).hexdigest()
        _digests[_file_key(path, st)] = digest
        table = [
            [t.name, t.dims, t.ggml_type, t.type_name, t.data_offset, t.n_bytes] for t in tensors
        ]
        try:
            _write_json(
                cache_dir() / SUBDIR / digest / "header.json",
                {"metadata": metadata, "tensors": table},
            )
            _write_json(_identity_file(path, st), {"end": end, "digest": digest})
        except (OSError, TypeError, ValueError) as e:
            logger.info("GGUF metadata cache: the header of %s not saved (%s)", path, e)


def _write_json(file: Path, value: Any) -> None:
    tmp = file.with_name(f"{file.name}.tmp-{os.getpid()}")
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(value), encoding="utf-8")
        os.replace(tmp, file)
    finally:
        tmp.unlink(missing_ok=True)


set_parsed_header_store(HeaderStore())


def _marker(path: Path, parts: Sequence[Path]) -> Path:
    stats = [os.stat(p) for p in parts]
    name = "_".join(f"{st.st_size}-{st.st_mtime_ns}-{st.st_ino}" for st in stats)
    return entry(path, "values-checked") / hashlib.sha256(name.encode()).hexdigest()[:32]


def _config_marker(path: Path, parts: Sequence[Path], config: Any) -> Path:
    import transformers

    stats = [os.stat(p) for p in parts]
    files = "_".join(f"{st.st_size}-{st.st_mtime_ns}-{st.st_ino}" for st in stats)
    name = f"{files}\n{transformers.__version__}\n{config.to_json_string(use_diff=False)}"
    return entry(path, "config-checked") / hashlib.sha256(name.encode()).hexdigest()[:32]


def config_checked(path: Path, parts: Sequence[Path], config: Any) -> bool:
    """Whether GGUF ``path`` (split into ``parts``, itself first) with
    ``config`` passed the config check (``gguf_checks.check_gguf_config``)
    unchanged since, under this transformers version."""
    return enabled() and _config_marker(path, parts, config).exists()


def mark_config_checked(path: Path, parts: Sequence[Path], config: Any) -> None:
    """Remember that GGUF ``path`` (``parts``) with ``config`` passed the
    config check."""
    if enabled():
        _touch(_config_marker(path, parts, config))


def _touch(marker: Path) -> None:
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
    except OSError as e:
        logger.info("GGUF metadata cache: %s not saved (%s)", marker, e)


def values_checked(path: Path, parts: Sequence[Path]) -> bool:
    """Whether GGUF ``path`` (split into ``parts``, itself first) passed the
    value check unchanged since (module docs)."""
    return enabled() and _marker(path, parts).exists()


def mark_values_checked(path: Path, parts: Sequence[Path]) -> None:
    """Remember that GGUF ``path`` (``parts``) passed the value check."""
    if enabled():
        _touch(_marker(path, parts))


#: Saved keys that are not arguments of the tokenizer class.
_NOT_KWARGS = ("backend", "is_local", "local_files_only", "tokenizer_class", "added_tokens_decoder")


def load_tokenizer_folder(folder: Path) -> Any:
    """The tokenizer saved in cache ``folder``: its saved class (a
    ``tokenizers``-backed one: ``TokenizersBackend``, ``GemmaTokenizer``,
    ``Qwen2Tokenizer``...) made over ``tokenizer.json`` as saved, with the
    saved special tokens and chat template. ``AutoTokenizer.from_pretrained``
    of the folder would give the same tokenizer from the same file, but
    parses it up to three times (twice in Python, to rebuild a class's
    vocabulary): ~3x as long for Gemma 3's 262,144 tokens, ~4x on a
    vocabulary with many added tokens. A class of another kind goes through
    ``AutoTokenizer``."""
    from transformers import AutoTokenizer, TokenizersBackend
    from transformers.models.auto.tokenization_auto import tokenizer_class_from_name

    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    name = config.get("tokenizer_class")
    cls = tokenizer_class_from_name(name) if isinstance(name, str) else None
    if not (isinstance(cls, type) and issubclass(cls, TokenizersBackend)):
        return AutoTokenizer.from_pretrained(folder)
    kwargs = {k: v for k, v in config.items() if k not in _NOT_KWARGS}
    tok = cls(tokenizer_file=str(folder / "tokenizer.json"), **kwargs)
    template = folder / "chat_template.jinja"
    if template.exists():
        tok.chat_template = template.read_text(encoding="utf-8")
    return tok
