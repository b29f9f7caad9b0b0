"""One parse of a GGUF file's metadata for its config and its tokenizer.

transformers builds the config of a GGUF file (``AutoConfig.from_pretrained(...,
gguf_file=...)``) with ``modeling_gguf_pytorch_utils.load_gguf_checkpoint(path,
return_tensors=False)``, which parses every metadata value with gguf-py's
``GGUFReader``, tokenizer arrays included (10-30 s for a 128k-token vocabulary
on a 2-core EPYC); ``AutoTokenizer.from_pretrained(..., gguf_file=...)`` calls it
again to pick the tokenizer class. Inside ``shared_gguf_metadata()``:

- that function answers each metadata-only call for a file from one parse: the
  result is kept (pickled) per (resolved path, modification time in ns, size)
  until the outermost scope ends, and every caller gets its own copy (callers
  pop keys from it). Calls that read tensors (``return_tensors=True``) go to
  transformers as before;
- ``gguf.GGUFReader`` reads through a plain ``numpy.ndarray`` view of its
  read-only memory map instead of the ``numpy.memmap`` itself
  (``ArrayViewReader``): the reader slices the map once per array element,
  and ``numpy.memmap``'s Python-level ``__getitem__`` / ``__array_finalize__``
  are ~3/4 of its time; the parsed fields are the same values, at a third of
  the CPU time (2.8 -> 1.0 s for SmolLM2's 49,152-token vocabulary).

Scopes nest and may be entered from several threads: the first entry installs
both in transformers' and gguf's modules (which transformers reads at each
call), the last exit restores the originals and drops the parsed metadata.
A module not yet imported when the scope opens is changed as its import
completes inside the scope (an import hook on ``sys.meta_path`` while the scope
is open), so a load that never reaches transformers' GGUF parser (a cached
config and tokenizer, ``executor.gguf_cache``) imports neither gguf-py nor that
module (0.4-0.7 s of a 1B-shaped file's second load, AMD EPYC Zen 5).
"""

from __future__ import annotations

import importlib.abc
import os
import pickle
import sys
import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from types import ModuleType
from typing import Any

from ..nested_scope import NestedScope

_lock = threading.Lock()
_original: Callable[..., Any] | None = None
_original_reader: Any = None
_parsed: dict[tuple[str, int, int], bytes] = {}


def _array_view_reader(gguf: ModuleType) -> type:
    import numpy as np

    class ArrayViewReader(gguf.GGUFReader):  # type: ignore[name-defined]
        """gguf-py's reader; opened read-only (``mode="r"``), its ``data`` is a
        plain ``numpy.ndarray`` view of the ``numpy.memmap`` (which stays
        alive as the view's base)."""

        def __init__(self, path: Any, mode: str = "r") -> None:
            self._plain_view = mode == "r"
            super().__init__(path, mode)

        @property
        def data(self) -> Any:
            return self._data

        @data.setter
        def data(self, value: Any) -> None:
            plain = self._plain_view and isinstance(value, np.memmap)
            self._data = value.view(np.ndarray) if plain else value

    return ArrayViewReader


def _file_key(path: Any) -> tuple[str, int, int]:
    st = os.stat(path)
    return os.path.realpath(path), st.st_mtime_ns, st.st_size


def _shared(
    original: Callable[..., Any],
) -> Callable[..., Any]:
    def load_gguf_checkpoint(
        gguf_checkpoint_path: Any, return_tensors: bool = False, *args: Any, **kwargs: Any
    ) -> Any:
        if return_tensors or args or any(v is not None for v in kwargs.values()):
            return original(gguf_checkpoint_path, return_tensors, *args, **kwargs)
        key = _file_key(gguf_checkpoint_path)
        with _lock:
            cached = _parsed.get(key)
        if cached is None:
            parsed = original(gguf_checkpoint_path, return_tensors=False)
            cached = pickle.dumps(parsed, protocol=pickle.HIGHEST_PROTOCOL)
            with _lock:
                _parsed[key] = cached
            return parsed
        return pickle.loads(cached)

    return load_gguf_checkpoint


_GGUF = "gguf"
_MGPU = "transformers.modeling_gguf_pytorch_utils"


def _patch(name: str, module: ModuleType) -> None:
    """Install this module's change into ``module`` (gguf-py or transformers'
    GGUF utilities), keeping the original to restore."""
    global _original, _original_reader
    if name == _GGUF:
        _original_reader = module.GGUFReader
        setattr(module, "GGUFReader", _array_view_reader(module))  # noqa: B010
    else:
        _original = getattr(module, "load_gguf_checkpoint")  # noqa: B009
        setattr(module, "load_gguf_checkpoint", _shared(_original))  # noqa: B010


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for gguf-py and transformers' GGUF utilities it
    asks the finders after it and wraps the module loader's ``exec_module``
    so that ``_patch`` runs as soon as the module's own code has."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> Any:
        if fullname not in (_GGUF, _MGPU) or fullname in sys.modules:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is None:
                continue
            if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                _patch_after_exec(spec.loader, fullname)
            return spec
        return None


def _patch_after_exec(loader: Any, name: str) -> None:
    """``loader`` (this one module's) runs ``_patch`` after the module's code,
    while the scope is still open."""
    exec_module = loader.exec_module

    def exec_and_patch(module: ModuleType) -> None:
        exec_module(module)
        with _lock:
            if _hook in sys.meta_path:
                _patch(name, module)

    loader.exec_module = exec_and_patch


_hook = _PatchOnImport()


def _install() -> None:
    for name in (_GGUF, _MGPU):
        module = sys.modules.get(name)
        if module is not None:
            _patch(name, module)
    sys.meta_path.insert(0, _hook)


def _uninstall() -> None:
    global _original, _original_reader
    with _lock:
        if _hook in sys.meta_path:
            sys.meta_path.remove(_hook)
        gguf = sys.modules.get(_GGUF)
        if gguf is not None and _original_reader is not None:
            setattr(gguf, "GGUFReader", _original_reader)  # noqa: B010
        mgpu = sys.modules.get(_MGPU)
        if mgpu is not None and _original is not None:
            setattr(mgpu, "load_gguf_checkpoint", _original)  # noqa: B010
        _original = _original_reader = None
        _parsed.clear()


_SHARED = NestedScope(_install, _uninstall)


def shared_gguf_metadata() -> AbstractContextManager[None]:
    """Within this scope, transformers parses each GGUF file's metadata once
    for configs and tokenizers (module docs). Outside it, and for tensors,
    transformers behaves as it does without pagedrs."""
    return _SHARED.scope()
