"""The per-request mailbox between the engine thread and an asyncio consumer."""

from __future__ import annotations

import asyncio
from typing import Any

from ..outputs import RequestOutput


class RequestStream:
    """Latest output of one request, handed from the engine thread to its consumer.

    Outputs are cumulative (text and token ids so far), so a consumer slower than
    the engine only needs the newest one: ``put`` replaces an unread output
    instead of queueing it, which bounds memory per request. An error replaces
    any output and ends the stream.

    ``put`` must run on the consumer's event loop (the engine thread reaches it
    with ``loop.call_soon_threadsafe``); ``get`` is awaited there.

    Args:
        request_id: the caller's request id.
        loop: the event loop of the consumer.
    """

    def __init__(self, request_id: str, loop: asyncio.AbstractEventLoop) -> None:
        self.request_id = request_id
        self.loop = loop
        self.finished = False
        self._item: RequestOutput | BaseException | None = None
        self._ready = asyncio.Event()

    def put(self, item: RequestOutput | BaseException) -> None:
        """Offer the newest output, or an error that ends the stream (event loop only)."""
        if isinstance(self._item, BaseException):
            return  # an error is final
        self._item = item
        self._ready.set()

    async def get(self) -> RequestOutput:
        """Wait for the next (newest) output.

        Raises:
            BaseException: the error the engine delivered for this request.
        """
        await self._ready.wait()
        self._ready.clear()
        item, self._item = self._item, None
        assert item is not None
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        if item.finished:
            self.finished = True
        return item


def deliver(items: list[tuple[RequestStream, Any]]) -> list[RequestStream]:
    """Hand items to their streams from any thread, one callback per event loop.

    Returns:
        the streams whose event loop is closed (nobody listens: the caller
        aborts their requests).
    """
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[RequestStream, Any]]] = {}
    for stream, item in items:
        by_loop.setdefault(stream.loop, []).append((stream, item))
    closed: list[RequestStream] = []
    for loop, batch in by_loop.items():
        try:
            loop.call_soon_threadsafe(_put_all, batch)
        except RuntimeError:  # the consumer's loop is closed
            closed.extend(stream for stream, _ in batch)
    return closed


def _put_all(items: list[tuple[RequestStream, Any]]) -> None:
    for stream, item in items:
        stream.put(item)
