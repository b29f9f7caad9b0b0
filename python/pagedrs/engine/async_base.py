"""The errors the server's engine clients raise (``AsyncLLM``, the Ray Serve
pool client), and ``AsyncLLM``'s output listeners, counters of the last step,
bounded waiting queue, and iteration over one request's stream."""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

from ..outputs import RequestOutput
from .request_stream import RequestStream

logger = logging.getLogger(__name__)

OutputListener = Callable[[RequestOutput], None]


class QueueFullError(RuntimeError):
    """The waiting queue holds ``max_waiting_requests`` requests: retry later (HTTP 503)."""


class EngineDeadError(RuntimeError):
    """The engine loop has stopped (shut down, or a fatal error); no request can run."""


class RequestFailedError(RuntimeError):
    """A step that held this request raised; the request was aborted, the engine goes on."""


class AsyncEngineBase:
    """Listeners, published counters and the waiting-queue bound.

    Args:
        max_waiting_requests: bound of the waiting queue (requests accepted and
            not yet scheduled, preempted ones included).
        stats: the engine's ``kv_cache_stats()`` at start.

    Raises:
        ValueError: ``max_waiting_requests`` < 1.
    """

    def __init__(self, max_waiting_requests: int, stats: dict[str, Any]) -> None:
        if max_waiting_requests < 1:
            raise ValueError(f"max_waiting_requests must be >= 1, got {max_waiting_requests}")
        self.max_waiting_requests = max_waiting_requests
        self._listeners: list[OutputListener] = []
        self._lock = threading.Lock()
        self._stats = stats
        self._num_pending_adds = 0

    def add_output_listener(self, listener: OutputListener) -> None:
        """Call ``listener(output)`` on the engine's output thread for every
        output, the final one of every request included (aborted and failed
        ones end with finish_reason "abort"). It must be quick and thread-safe;
        its errors are logged and ignored."""
        self._listeners.append(listener)

    def kv_cache_stats(self) -> dict[str, Any]:
        """The engine's ``kv_cache_stats()`` as of its last step (a copy, its
        per-group list included)."""
        with self._lock:
            stats = dict(self._stats)
        if "groups" in stats:
            stats["groups"] = [dict(g) for g in stats["groups"]]
        return stats

    def num_waiting_requests(self) -> int:
        """Requests accepted and not yet scheduled (an upper estimate)."""
        with self._lock:
            return self._num_pending_adds + int(self._stats.get("num_waiting", 0))

    def _check_queue(self) -> None:
        """Raise ``QueueFullError`` if the waiting queue is full (hold ``_lock``)."""
        waiting = self._num_pending_adds + int(self._stats.get("num_waiting", 0))
        if waiting >= self.max_waiting_requests:
            raise QueueFullError(
                f"the waiting queue is full ({waiting} requests, "
                f"max_waiting_requests={self.max_waiting_requests}); retry later"
            )

    def _notify(self, output: RequestOutput) -> None:
        for listener in self._listeners:
            try:
                listener(output)
            except Exception:
                logger.exception("output listener failed")


async def stream_outputs(
    stream: RequestStream, abort: Callable[[], None]
) -> AsyncIterator[RequestOutput]:
    """Yield a request's outputs until the finished one; ``abort()`` if the
    consumer leaves first (break, cancellation, closing the generator)."""
    try:
        while True:
            out = await stream.get()
            yield out
            if out.finished:
                return
    finally:
        if not stream.finished:
            abort()
