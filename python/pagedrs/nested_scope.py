"""A process-wide change held while any of its nested scopes is open.

Scopes may nest and may be entered from several threads: the first entry
applies the change, the last exit undoes it (``engine.core.startup_gc``,
``executor.gguf_metadata``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class NestedScope:
    """``apply`` on the first entry into ``scope()``, ``undo`` on the last
    exit; both run under one lock, so concurrent entries and exits see the
    change whole."""

    def __init__(self, apply: Callable[[], None], undo: Callable[[], None]) -> None:
        self._apply = apply
        self._undo = undo
        self._lock = threading.Lock()
        self._depth = 0

    @contextmanager
    def scope(self) -> Iterator[None]:
        """The change is in effect inside this scope (class docs)."""
        with self._lock:
            if self._depth == 0:
                self._apply()
            self._depth += 1
        try:
            yield
        finally:
            with self._lock:
                self._depth -= 1
                if self._depth == 0:
                    self._undo()
