"""Async helpers of the handlers: peek a stream's first item, merge streams,
and stop waiting when the client goes away."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable
from typing import TypeVar

from starlette.requests import Request

T = TypeVar("T")

DISCONNECT_POLL_S = 0.5


class ClientDisconnected(Exception):
    """The client closed the connection before the response was ready."""


async def until_disconnected(aw: Awaitable[T], request: Request) -> T:
    """Await ``aw``, polling the connection every ``DISCONNECT_POLL_S`` seconds.

    Raises:
        ClientDisconnected: the client left; ``aw`` was cancelled.
    """
    task = asyncio.ensure_future(aw)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if done:
                return task.result()
            if await request.is_disconnected():
                raise ClientDisconnected()
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


async def prepend(first: T, rest: AsyncIterator[T]) -> AsyncGenerator[T, None]:
    """``first``, then the items of ``rest``; closing it closes ``rest``."""
    try:
        yield first
        async for item in rest:
            yield item
    finally:
        aclose = getattr(rest, "aclose", None)
        if aclose is not None:
            await aclose()


async def merge(iterators: list[AsyncIterator[T]]) -> AsyncGenerator[tuple[int, T], None]:
    """Items of several iterators as ``(index of its iterator, item)``, as they come.

    An error of any iterator is raised at once; leaving early cancels and closes
    them all.
    """
    if len(iterators) == 1:  # the common case, without tasks
        try:
            async for item in iterators[0]:
                yield 0, item
        finally:
            await _close(iterators[0])
        return
    pending: dict[asyncio.Task[T], int] = {
        asyncio.ensure_future(it.__anext__()): i for i, it in enumerate(iterators)
    }
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                i = pending.pop(task)
                try:
                    item = task.result()
                except StopAsyncIteration:
                    continue
                pending[asyncio.ensure_future(iterators[i].__anext__())] = i
                yield i, item
    finally:
        for task in pending:
            task.cancel()
        for task in pending:
            with contextlib.suppress(BaseException):
                await task
        for it in iterators:
            await _close(it)


async def _close(it: AsyncIterator[T]) -> None:
    aclose = getattr(it, "aclose", None)
    if aclose is not None:
        with contextlib.suppress(Exception):
            await aclose()
