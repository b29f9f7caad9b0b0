"""``AsyncLLM``: the asyncio front end over an engine core.

The engine core (``engine/core``) runs schedule -> execute -> sample -> update
and nothing else; this front end validates and queues requests, turns the
core's token ids into text with its ``OutputProcessor`` (stop strings included)
and hands each request's outputs to its event loop. By default the core runs
in its own process and the two exchange msgpack frames over ZeroMQ, so
tokenization, detokenization, JSON and HTTP never hold the core's GIL; with
``engine_core_process=False`` it runs on a thread of this process (messages as
Python objects, no serialization).
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import logging
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

from ..executor.model_loader import load_tokenizer, local_model_path
from ..inputs import PromptType
from ..lora.request import LoRARequest
from ..outputs import RequestOutput
from ..sampling_params import BeamSearchParams, SamplingParams
from .arg_utils import EngineArgs
from .async_base import (
    AsyncEngineBase,
    EngineDeadError,
    QueueFullError,
    RequestFailedError,
    stream_outputs,
)
from .core.errors import InvalidRequestError
from .core.messages import AddBeamSearchRequest, CoreOutputs
from .core_client import InThreadCoreClient, ProcessCoreClient, make_core_client
from .input_processor import InputProcessor, ProcessedPrompt
from .output_processor import OutputProcessor
from .request_stream import RequestStream, deliver

__all__ = ["AsyncLLM", "EngineDeadError", "QueueFullError", "RequestFailedError"]

# An aborted request's final output and the stream waiting for it (if any).
_AbortFinal = tuple[RequestStream | None, RequestOutput]

logger = logging.getLogger(__name__)


class AsyncLLM(AsyncEngineBase):
    """Continuous batching for asyncio callers.

    Args:
        engine_args: arguments of the engine the core builds.
        max_waiting_requests: bound of the waiting queue (requests accepted and
            not yet scheduled, preempted ones included); ``generate`` raises
            ``QueueFullError`` beyond it.
        torch_threads: torch threads of the core process (default: every CPU
            core); the in-thread core uses this process's.
        log_level: logging level of the core process.
        engine_core_process: run the core in its own process (default), or on
            a thread of this one.

    Attributes:
        last_step_time: seconds the core's last step took (as it measured).

    Raises:
        ValueError: invalid engine arguments or model (the core's message), or
            ``max_waiting_requests`` < 1.
        EngineCoreStartError: the core process died while starting.
    """

    def __init__(
        self,
        engine_args: EngineArgs | None = None,
        *,
        max_waiting_requests: int = 1024,
        torch_threads: int | None = None,
        log_level: str = "WARNING",
        engine_core_process: bool = True,
    ) -> None:
        if max_waiting_requests < 1:
            raise ValueError(f"max_waiting_requests must be >= 1, got {max_waiting_requests}")
        self.args = engine_args or EngineArgs()
        client = make_core_client(
            self.args,
            "process" if engine_core_process else "thread",
            torch_threads=torch_threads,
            log_level=log_level,
        )
        assert isinstance(client, (ProcessCoreClient, InThreadCoreClient))
        self._client = client
        if isinstance(client, InThreadCoreClient):
            # The core's tokenizer belongs to its thread: callers get a copy.
            self.tokenizer = copy.deepcopy(client.core.tokenizer)
        else:
            path = local_model_path(self.args.model, self.args.revision, self.args.download_dir)
            self.tokenizer = load_tokenizer(
                path, self.args.tokenizer, self.args.revision, self.args.download_dir
            )
        ready = client.ready
        super().__init__(max_waiting_requests, ready.stats)
        self.max_model_len: int = ready.max_model_len
        self._vocab_size = ready.vocab_size
        self.input_processor = InputProcessor(
            self.tokenizer,
            self.max_model_len,
            ready.vocab_size,
            self.args.max_logprobs,
            self.args.scheduling_policy,
        )
        self._outputs = OutputProcessor(self.tokenizer)
        self._streams: dict[str, RequestStream] = {}  # by core id
        self._core_ids: dict[str, str] = {}  # caller's id -> core id
        self._abort_finals: deque[list[_AbortFinal]] = deque()  # per AbortRequests sent
        self._next_id = itertools.count()
        self._dead: EngineDeadError | None = None
        self._stopping = False
        self.last_step_time = 0.0
        self._client.start(self._on_outputs, self._on_dead)

    @classmethod
    def from_engine_args(
        cls, engine_args: EngineArgs, max_waiting_requests: int = 1024
    ) -> AsyncLLM:
        """vLLM's constructor spelling: start the core and its front end."""
        return cls(engine_args, max_waiting_requests=max_waiting_requests)

    # ------------------------------------------------------------------ callers

    @property
    def is_running(self) -> bool:
        """True while the core serves."""
        return self._dead is None and not self._stopping and self._client.is_alive()

    @property
    def max_num_seqs(self) -> int:
        """Most sequences per step (the engine argument)."""
        return int(self.args.max_num_seqs)

    @property
    def vocab_size(self) -> int:
        """Size of the model's vocabulary, in tokens."""
        return self._vocab_size

    @property
    def core_pid(self) -> int | None:
        """Process id of the engine core (None when it runs in a thread)."""
        return self._client.pid

    def check_priority(self, priority: int) -> None:
        """Raises:
        InvalidRequestError: as ``validation.check_priority``."""
        self.input_processor.check_request(SamplingParams(), priority)

    async def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix, between two of the core's steps
        (publishing AllBlocksCleared when KV events are on). Returns False,
        changing nothing, while a request holds blocks.

        Raises:
            EngineDeadError: the core stopped.
        """
        await self.check_health()
        try:
            return bool(await asyncio.wrap_future(self._client.call("reset_prefix_cache")))
        except RuntimeError as exc:
            raise EngineDeadError(str(exc)) from None

    async def check_health(self) -> None:
        """Raises:
        EngineDeadError: the core has stopped."""
        if not self.is_running:
            raise self._dead or EngineDeadError("the engine core is not running")

    async def get_tokenizer(self) -> Any:
        """The HF tokenizer of the front end."""
        return self.tokenizer

    async def generate(
        self,
        prompt: PromptType | ProcessedPrompt,
        sampling_params: SamplingParams | BeamSearchParams,
        request_id: str,
        *,
        cache_salt: str | None = None,
        arrival_time: float | None = None,
        priority: int = 0,
        lora_request: LoRARequest | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Run one request; yield its outputs as they come, the last one finished.

        Outputs are cumulative (text and token ids so far); a consumer slower
        than the engine skips intermediate ones. Leaving the iteration early
        (break, cancellation, closing the generator) aborts the request.

        Args:
            prompt: text, token ids, ``{"prompt", "prompt_token_ids", "cache_salt"}``,
                or a ``ProcessedPrompt`` of ``input_processor``.
            sampling_params: how to sample; ``BeamSearchParams`` run a beam
                search, whose one output (its hypotheses, best first) comes
                when it is over.
            request_id: unique among live requests.
            cache_salt: per-tenant salt of the prefix cache.
            arrival_time: seconds since the epoch (default now).
            priority: lower runs first under ``scheduling_policy="priority"``.
            lora_request: the LoRA adapter to run with (``enable_lora``), or
                None for the base model; it crosses to the core in the
                ``AddRequest`` message.
        Raises:
            QueueFullError: the waiting queue is full (nothing was queued).
            InvalidRequestError: an invalid prompt or parameters, a
                duplicate request id, or (from the core) a LoRA adapter that
                cannot be loaded or does not fit (param ``model``).
            RequestFailedError: a step that held the request raised.
            EngineDeadError: the core stopped.
        """
        stream = self._add(
            prompt, sampling_params, request_id, cache_salt, arrival_time, priority, lora_request
        )
        async for out in stream_outputs(stream, lambda: self._abort(request_id)):
            yield out

    def _add(
        self,
        prompt: PromptType | ProcessedPrompt,
        params: SamplingParams | BeamSearchParams,
        request_id: str,
        cache_salt: str | None,
        arrival_time: float | None,
        priority: int,
        lora_request: LoRARequest | None = None,
    ) -> RequestStream:
        processed = self.input_processor.prompt(prompt)
        core_id = f"{request_id}#{next(self._next_id)}"
        try:
            req = self.input_processor.request(
                core_id,
                processed,
                params,
                arrival_time=arrival_time,
                cache_salt=cache_salt,
                priority=priority,
                lora_request=lora_request,
            )
        except TypeError as exc:
            raise InvalidRequestError(str(exc)) from None
        arrival, text, ids = req.arrival_time, processed.text, processed.token_ids
        stream = RequestStream(request_id, asyncio.get_running_loop())
        with self._lock:
            if self._dead is not None or self._stopping:
                raise self._dead or EngineDeadError("the engine is shutting down")
            if request_id in self._core_ids:
                raise InvalidRequestError(f"request id {request_id!r} is already in use")
            self._check_queue()
            if isinstance(req, AddBeamSearchRequest):
                self._outputs.add_beam_search(core_id, request_id, text, ids, arrival)
            else:
                self._outputs.add(core_id, request_id, text, ids, req.params, arrival)
            self._streams[core_id] = stream
            self._core_ids[request_id] = core_id
            self._num_pending_adds += 1
        if isinstance(req, AddBeamSearchRequest):
            self._client.add_beam_search_request(req)
        else:
            self._client.add_request(req)
        return stream

    async def abort(self, request_id: str) -> None:
        """Abort a request: the core frees its blocks at its next step
        boundary, then its iterator ends with a finished output (finish_reason
        "abort"). Unknown or finished ids are ignored; the id is free at once."""
        self._abort(request_id)

    def _abort(self, request_id: str) -> None:
        with self._lock:
            core_id = self._core_ids.pop(request_id, None)
            if core_id is None:
                return
            final = self._outputs.finish(core_id)
            stream = self._streams.pop(core_id, None)
            if final is not None:
                self._abort_finals.append([(stream, final)])
                self._client.abort_requests([core_id])

    def shutdown(self, timeout: float | None = 60.0) -> None:
        """Stop the core (after its current step), fail every open request with
        ``EngineDeadError`` and close the sockets (idempotent).

        Args:
            timeout: seconds to wait for the core to exit before killing it.
        """
        with self._lock:
            if self._stopping:
                return
            self._stopping = True
        self._fail_all(EngineDeadError("the engine was shut down"))
        self._client.close(60.0 if timeout is None else timeout)

    # ------------------------------------------------------ the output thread

    def _on_outputs(self, out: CoreOutputs) -> None:
        items: list[tuple[RequestStream, Any]] = []
        finals: list[RequestOutput] = []
        with self._lock:
            self._stats = out.stats
            self._num_pending_adds -= out.num_added
            self.last_step_time = out.step_time
            for _ in range(out.num_aborts):  # the core has freed their blocks
                for stream, final in self._abort_finals.popleft():
                    finals.append(final)
                    if stream is not None:
                        items.append((stream, final))
            for err in out.errors:
                err_final = self._outputs.finish(err.request_id)
                stream = self._streams.pop(err.request_id, None)
                if stream is not None:
                    del self._core_ids[stream.request_id]
                if err.kind == "failed" and err_final is not None:
                    finals.append(err_final)
                if stream is not None:
                    exc: Exception = (
                        InvalidRequestError(err.message, param=err.param, code=err.code)
                        if err.kind == "invalid"
                        else RequestFailedError(err.message)
                    )
                    items.append((stream, exc))
            result = self._outputs.apply(out.deltas)
            for rid, output in result.outputs:
                finals.append(output)
                stream = self._streams.get(rid)
                if output.finished and stream is not None:
                    del self._streams[rid], self._core_ids[stream.request_id]
                if stream is not None:
                    items.append((stream, output))
        for rid, index, stop in result.stops:
            self._client.stop_sequence(rid, index, stop)
        for output in finals:
            self._notify(output)
        for stream in deliver(items):  # nobody listens: abort
            self._abort(stream.request_id)

    def _on_dead(self, message: str) -> None:
        logger.error("%s; failing every open request", message)
        self._fail_all(EngineDeadError(message))

    def _fail_all(self, error: EngineDeadError) -> None:
        with self._lock:
            if self._dead is None:
                self._dead = error
            ids = list(self._streams)
            finals = [self._outputs.finish(rid) for rid in ids]
            streams = [self._streams.pop(rid) for rid in ids]
            aborted = [item for batch in self._abort_finals for item in batch]
            self._abort_finals.clear()
            self._core_ids.clear()
            self._num_pending_adds = 0
        for final in finals:
            if final is not None:
                self._notify(final)
        for _, final in aborted:
            self._notify(final)
        items: list[tuple[RequestStream, Any]] = [(s, error) for s in streams]
        items += [(s, final) for s, final in aborted if s is not None]
        deliver(items)
