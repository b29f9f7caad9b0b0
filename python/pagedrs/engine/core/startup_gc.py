"""Python's cyclic garbage collector paused while an engine starts.

Loading a model allocates hundreds of thousands of Python objects (a GGUF
header's strings and tuples, the HF model's modules and parameters, the
tokenizer's vocabulary views). Each allocation counts towards the collector's
thresholds, and every few hundred thousand of them a full collection walks
every tracked object of the process: with torch and transformers imported
that is over a million objects, about 0.4 s per collection on a 2-core Xeon,
and a load of a 128k-token GGUF triggered four of them (over a third of its
CPU time). ``paused_gc`` turns automatic collection off for the startup and
restores the previous setting after it; garbage made meanwhile is collected
by the next automatic collection. The collector's thresholds and frozen
generation are left as they are.
"""

from __future__ import annotations

import gc
from contextlib import AbstractContextManager

from ...nested_scope import NestedScope

_was_enabled = False


def _pause() -> None:
    global _was_enabled
    _was_enabled = gc.isenabled()
    gc.disable()


def _restore() -> None:
    if _was_enabled:
        gc.enable()


_PAUSED = NestedScope(_pause, _restore)


def paused_gc() -> AbstractContextManager[None]:
    """Automatic garbage collection off inside this scope (module docs).

    Scopes nest and may be entered from several threads (``NestedScope``):
    the first entry records whether collection was on and turns it off, the
    last exit turns it back on if it was.
    """
    return _PAUSED.scope()
