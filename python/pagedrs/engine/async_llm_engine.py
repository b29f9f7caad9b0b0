"""``AsyncLLMEngine``: the step-driven engine behind an asyncio interface.

One worker thread owns the ``LLMEngine`` and steps it while requests are in
flight. Event loops never call the engine: ``generate`` and ``abort`` queue
commands that the worker applies between two steps, and the worker hands each
step's outputs back to the event loop of each request with
``call_soon_threadsafe``. Model work (seconds per step on a CPU) therefore
never blocks an event loop.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from ..outputs import RequestOutput
from ..sampling_params import SamplingParams
from .arg_utils import EngineArgs
from .async_base import (
    AsyncEngineBase,
    EngineDeadError,
    QueueFullError,
    RequestFailedError,
    stream_outputs,
)
from .llm import PromptType, _as_prompt
from .llm_engine import LLMEngine
from .request_stream import RequestStream, deliver

__all__ = ["AsyncLLMEngine", "EngineDeadError", "QueueFullError", "RequestFailedError"]

logger = logging.getLogger(__name__)


@dataclass
class _Add:
    stream: RequestStream
    prompt: str | list[int]
    prompt_token_ids: list[int] | None
    params: SamplingParams
    arrival_time: float
    cache_salt: str | None
    priority: int = 0


@dataclass
class _Abort:
    request_id: str


class AsyncLLMEngine(AsyncEngineBase):
    """Continuous batching for asyncio callers.

    Args:
        engine_args: arguments of the engine to build (ignored with ``engine``).
        engine: an existing engine to drive; nothing else may call it afterwards.
        max_waiting_requests: bound of the waiting queue (requests accepted and
            not yet scheduled, preempted ones included); ``generate`` raises
            ``QueueFullError`` beyond it.

    Raises:
        ValueError: invalid engine arguments or ``max_waiting_requests`` < 1.
    """

    def __init__(
        self,
        engine_args: EngineArgs | None = None,
        *,
        engine: LLMEngine | None = None,
        max_waiting_requests: int = 1024,
    ) -> None:
        if max_waiting_requests < 1:
            raise ValueError(f"max_waiting_requests must be >= 1, got {max_waiting_requests}")
        self.engine = engine if engine is not None else LLMEngine(engine_args or EngineArgs())
        super().__init__(max_waiting_requests, self.engine.kv_cache_stats())
        # A tokenizer for callers' threads: the engine's own belongs to the worker.
        self.tokenizer = copy.deepcopy(self.engine.tokenizer)
        self.max_model_len: int = self.engine.max_model_len
        self._wakeup = threading.Condition(self._lock)
        self._commands: list[_Add | _Abort] = []
        self._stopping = False
        self._dead: EngineDeadError | None = None
        self._live: dict[str, RequestStream] = {}  # worker thread only
        self._thread = threading.Thread(target=self._run, name="pagedrs-engine", daemon=True)
        self._thread.start()

    @classmethod
    def from_engine_args(
        cls, engine_args: EngineArgs, max_waiting_requests: int = 1024
    ) -> AsyncLLMEngine:
        """vLLM's constructor spelling: build the engine and start its loop."""
        return cls(engine_args, max_waiting_requests=max_waiting_requests)

    # ------------------------------------------------------------------ callers

    @property
    def is_running(self) -> bool:
        """True while the engine loop accepts requests."""
        return self._dead is None and self._thread.is_alive()

    @property
    def max_num_seqs(self) -> int:
        """Most sequences per step (the engine argument)."""
        return int(self.engine.args.max_num_seqs)

    @property
    def vocab_size(self) -> int:
        """Size of the model's vocabulary, in tokens."""
        return int(self.engine.model.config.vocab_size)

    def check_priority(self, priority: int) -> None:
        """Raises:
        ValueError: as ``validation.check_priority``."""
        self.engine.check_priority(priority)

    async def check_health(self) -> None:
        """Raises:
        EngineDeadError: the loop has stopped."""
        if not self.is_running:
            raise self._dead or EngineDeadError("the engine loop is not running")

    async def get_tokenizer(self) -> Any:
        """The HF tokenizer for the caller's thread (a copy of the engine's)."""
        return self.tokenizer

    async def generate(
        self,
        prompt: PromptType,
        sampling_params: SamplingParams,
        request_id: str,
        *,
        cache_salt: str | None = None,
        arrival_time: float | None = None,
        priority: int = 0,
    ) -> AsyncIterator[RequestOutput]:
        """Run one request; yield its outputs as they come, the last one finished.

        Outputs are cumulative (text and token ids so far); a consumer slower
        than the engine skips intermediate ones. Leaving the iteration early
        (break, cancellation, closing the generator) aborts the request.

        Args:
            prompt: text, token ids, or ``{"prompt", "prompt_token_ids", "cache_salt"}``.
            sampling_params: how to sample.
            request_id: unique among live requests.
            cache_salt: per-tenant salt of the prefix cache.
            arrival_time: seconds since the epoch (default now).
            priority: lower runs first under ``scheduling_policy="priority"``.
        Raises:
            QueueFullError: the waiting queue is full (nothing was queued).
            ValueError: an invalid prompt or a duplicate request id.
            RequestFailedError: a step that held the request raised.
            EngineDeadError: the engine loop stopped.
        """
        try:
            text, ids, salt = _as_prompt(prompt)
        except TypeError as exc:
            raise ValueError(str(exc)) from None
        stream = self._submit(
            _Add(
                RequestStream(request_id, asyncio.get_running_loop()),
                text if text is not None else list(ids or []),
                ids,
                sampling_params,
                arrival_time if arrival_time is not None else time.time(),
                cache_salt if cache_salt is not None else salt,
                priority,
            )
        )
        async for out in stream_outputs(stream, lambda: self._enqueue(_Abort(request_id))):
            yield out

    async def abort(self, request_id: str) -> None:
        """Abort a request: its blocks are freed at the next step boundary and its
        iterator ends with a finished output (finish_reason "abort"). Unknown or
        finished ids are ignored."""
        self._enqueue(_Abort(request_id))

    def shutdown(self, timeout: float | None = 60.0) -> None:
        """Stop the loop after the current step, abort every request (their
        iterators raise ``EngineDeadError``) and join the worker thread.

        Args:
            timeout: seconds to wait for the worker; None waits for ever.
        """
        with self._lock:
            self._stopping = True
            self._wakeup.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    # ---------------------------------------------------------------- commands

    def _submit(self, add: _Add) -> RequestStream:
        with self._lock:
            if self._dead is not None or self._stopping:
                raise self._dead or EngineDeadError("the engine is shutting down")
            self._check_queue()
            self._num_pending_adds += 1
            self._commands.append(add)
            self._wakeup.notify()
        return add.stream

    def _enqueue(self, cmd: _Abort) -> None:
        with self._lock:
            if self._dead is None:
                self._commands.append(cmd)
                self._wakeup.notify()

    # ------------------------------------------------------------ worker thread

    def _run(self) -> None:
        try:
            while True:
                busy = self.engine.has_unfinished_requests()
                with self._lock:
                    while not (self._commands or self._stopping or busy):
                        self._wakeup.wait()
                    if self._stopping:
                        break
                    commands, self._commands = self._commands, []
                deliveries = self._apply(commands)
                self._publish_stats(sum(isinstance(c, _Add) for c in commands))
                self._deliver(deliveries)
                if self.engine.has_unfinished_requests():
                    items = self._step()
                    self._publish_stats(0)  # before delivery: a finished request is freed
                    self._deliver(items)
            self._close(EngineDeadError("the engine was shut down"))
        except BaseException as exc:  # the loop itself broke: nothing can run
            logger.exception("engine loop died")
            self._close(EngineDeadError(f"the engine loop died: {type(exc).__name__}: {exc}"))

    def _apply(self, commands: list[_Add | _Abort]) -> list[tuple[RequestStream, Any]]:
        out: list[tuple[RequestStream, Any]] = []
        for cmd in commands:
            if isinstance(cmd, _Abort):
                stream = self._live.pop(cmd.request_id, None)
                final = self.engine.abort_request(cmd.request_id)
                if final is not None:
                    self._notify(final)
                    if stream is not None:
                        out.append((stream, final))
                continue
            rid = cmd.stream.request_id
            try:
                if rid in self._live:
                    raise ValueError(f"request id {rid!r} is already in use")
                self.engine.add_request(
                    rid,
                    cmd.prompt,
                    cmd.params,
                    arrival_time=cmd.arrival_time,
                    prompt_token_ids=cmd.prompt_token_ids,
                    cache_salt=cmd.cache_salt,
                    priority=cmd.priority,
                )
            except (ValueError, TypeError, OverflowError) as exc:
                # Bad input fails this request alone; the loop serves the others.
                out.append((cmd.stream, ValueError(str(exc))))
            else:
                self._live[rid] = cmd.stream
        return out

    def _step(self) -> list[tuple[RequestStream, Any]]:
        try:
            outputs = self.engine.step()
        except Exception as exc:
            return self._fail_step(exc)
        out: list[tuple[RequestStream, Any]] = []
        for o in outputs:
            self._notify(o)
            stream = self._live.pop(o.request_id) if o.finished else self._live.get(o.request_id)
            if stream is not None:
                out.append((stream, o))
        return out

    def _fail_step(self, exc: Exception) -> list[tuple[RequestStream, Any]]:
        """Abort the requests of a step that raised; the others go on."""
        logger.exception("a step failed; aborting its requests")
        ids: list[str] | None = getattr(exc, "request_ids", None)
        if ids is None:
            ids = list(self._live)
        error = f"the model loop failed on this request: {type(exc).__name__}: {exc}"
        out: list[tuple[RequestStream, Any]] = []
        for rid in ids:
            final = self.engine.abort_request(rid)
            if final is not None:
                self._notify(final)
            stream = self._live.pop(rid, None)
            if stream is not None:
                out.append((stream, RequestFailedError(error)))
        return out

    def _publish_stats(self, num_applied_adds: int) -> None:
        stats = self.engine.kv_cache_stats()
        with self._lock:
            self._stats = stats
            self._num_pending_adds -= num_applied_adds

    def _deliver(self, items: list[tuple[RequestStream, Any]]) -> None:
        """Hand items to their streams; abort the requests nobody listens to."""
        for stream in deliver(items):
            if self._live.pop(stream.request_id, None) is not None:
                final = self.engine.abort_request(stream.request_id)
                if final is not None:
                    self._notify(final)

    def _close(self, error: EngineDeadError) -> None:
        """Abort everything left and fail its streams (worker thread, at exit)."""
        with self._lock:
            self._dead = error
            commands, self._commands = self._commands, []
            self._num_pending_adds = 0
        items: list[tuple[RequestStream, Any]] = [
            (c.stream, error) for c in commands if isinstance(c, _Add)
        ]
        for rid, stream in list(self._live.items()):
            try:
                final = self.engine.abort_request(rid)
                if final is not None:
                    self._notify(final)
            except BaseException:
                logger.exception("abort of %s failed at shutdown", rid)
            items.append((stream, error))
        self._live.clear()
        try:
            self._publish_stats(0)
        except BaseException:
            logger.exception("stats failed at shutdown")
        try:
            self.engine.shutdown()  # tensor-parallel workers, if any
        except BaseException:
            logger.exception("engine shutdown failed")
        self._deliver(items)
