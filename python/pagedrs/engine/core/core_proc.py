"""The engine core's busy loop: apply the front end's messages between steps,
run a step while requests are live, report each step's deltas, errors and
counters. ``CoreLoop`` serves both the engine-core process (``run_engine_core``,
ZeroMQ sockets, msgpack) and ``AsyncLLM``'s in-thread core (a queue, no
serialization).

The process's main thread does nothing else: messages are decoded between steps
(a few microseconds each) and ZeroMQ's own I/O thread moves the bytes. The
process exits on ``Shutdown``, when its parent is gone, or after reporting a
fatal error (``CoreFailed``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

import msgspec
import zmq

from .engine_core import EngineCore
from .errors import InvalidRequestError, StepFailedError
from .messages import (
    AbortRequests,
    AddBeamSearchRequest,
    AddRequest,
    CoreFailed,
    CoreInput,
    CoreOutputs,
    CoreReady,
    RequestDelta,
    RequestError,
    Shutdown,
    StopSequence,
    UtilityCall,
    UtilityResult,
    check_utility,
    input_decoder,
)

logger = logging.getLogger(__name__)

# Idle wait between checks that the parent is alive (ms).
_IDLE_POLL_MS = 500


class CoreLoop:
    """An ``EngineCore`` driven by messages.

    Args:
        core: the engine core; nothing else may call it.
    """

    def __init__(self, core: EngineCore) -> None:
        self.core = core
        self._errors: list[RequestError] = []
        self._results: list[UtilityResult] = []
        self._aborted: list[RequestDelta] = []  # beam searches' final deltas
        self._num_added = 0
        self._num_aborts = 0

    def ready(self) -> CoreReady:
        """The message saying the core serves."""
        core = self.core
        return CoreReady(core.max_model_len, core.vocab_size, core.kv_cache_stats())

    def apply(self, msg: CoreInput) -> None:
        """Apply one front-end message (``Shutdown`` is the caller's)."""
        if isinstance(msg, (AddRequest, AddBeamSearchRequest)):
            try:
                if isinstance(msg, AddRequest):
                    self.core.add_request(msg)
                else:
                    self.core.add_beam_search_request(msg)
            except InvalidRequestError as exc:
                self._errors.append(
                    RequestError(msg.request_id, "invalid", str(exc), exc.param, exc.code)
                )
            except (ValueError, TypeError, OverflowError) as exc:
                self._errors.append(RequestError(msg.request_id, "invalid", str(exc)))
            self._num_added += 1
        elif isinstance(msg, AbortRequests):
            for rid in msg.request_ids:
                delta = self.core.abort_request(rid)
                if delta is not None:
                    self._aborted.append(delta)
            self._num_aborts += 1
        elif isinstance(msg, StopSequence):
            self.core.stop_sequence(msg.request_id, msg.index, msg.stop_reason)
        elif isinstance(msg, UtilityCall):
            self._results.append(self._call(msg))

    def _call(self, msg: UtilityCall) -> UtilityResult:
        try:
            check_utility(msg.method)
            return UtilityResult(msg.call_id, getattr(self.core, msg.method)())
        except Exception as exc:
            return UtilityResult(msg.call_id, error=f"{type(exc).__name__}: {exc}")

    def has_work(self) -> bool:
        """True while a request is waiting or running."""
        return self.core.has_unfinished_requests()

    def has_news(self) -> bool:
        """True when applied messages produced something the front end waits
        for (errors, utility results, or aborts whose blocks are now free)."""
        return bool(self._errors) or bool(self._results) or self._num_aborts > 0

    def step(self) -> CoreOutputs:
        """Run one step (if any request is live) and collect its deltas, the
        errors since the last call and the engine's counters."""
        deltas: list[RequestDelta] = []
        t0 = time.perf_counter()
        ran = self.core.has_unfinished_requests()
        if ran:
            try:
                deltas = self.core.step()
            except StepFailedError as exc:
                logger.exception("a step failed; aborting its requests")
                for rid in exc.request_ids:
                    self.core.abort_request(rid)
                    msg = f"the model loop failed on this request: {exc}"
                    self._errors.append(RequestError(rid, "failed", msg))
        return self._outputs(deltas, time.perf_counter() - t0 if ran else 0.0)

    def flush(self) -> CoreOutputs:
        """The errors and aborts since the last call, without a step."""
        return self._outputs([], 0.0)

    def _outputs(self, deltas: list[RequestDelta], step_time: float) -> CoreOutputs:
        out = CoreOutputs(
            self._aborted + deltas,
            self._errors,
            self.core.kv_cache_stats(),
            step_time,
            self._num_added,
            self._num_aborts,
            self._results,
        )
        self._errors, self._results, self._aborted = [], [], []
        self._num_added, self._num_aborts = 0, 0
        return out

    def run(
        self,
        receive: Callable[[float], list[CoreInput] | None],
        send: Callable[[CoreOutputs], None],
        alive: Callable[[], bool] = lambda: True,
    ) -> None:
        """Serve until ``Shutdown`` (or ``alive()`` turns false), then abort
        every request left.

        Args:
            receive: ``receive(timeout_s)`` returns the messages waiting, after
                waiting up to ``timeout_s`` for one (0: do not wait); None once
                the input is closed.
            send: hands outputs to the front end.
            alive: checked between waits (the engine-core process: its parent lives).
        """
        try:
            while alive():
                busy = self.has_work()
                msgs = receive(0.0 if busy else _IDLE_POLL_MS / 1000)
                if msgs is None:
                    return
                received = bool(msgs)
                for msg in msgs:
                    if isinstance(msg, Shutdown):
                        return
                    self.apply(msg)
                if not received and not busy:
                    continue
                if self.has_news() and self.has_work():
                    send(self.flush())  # before the step: aborts answered at once
                send(self.step())
        finally:
            try:
                self.core.abort_all()
            except Exception:
                logger.exception("aborting the requests left failed")


def run_engine_core(
    engine_args: Any,
    input_address: str,
    output_address: str,
    parent_pid: int,
    torch_threads: int,
    log_level: str = "WARNING",
) -> None:
    """Process entry point (``multiprocessing`` spawn target).

    Args:
        engine_args: the ``EngineArgs`` to build the engine from.
        input_address: ZeroMQ address the front end sends on (PULL here).
        output_address: ZeroMQ address the front end receives on (PUSH here).
        parent_pid: the front end's pid; the core exits when it is gone.
        torch_threads: torch's intra-op threads for the model.
        log_level: logging level of this process.
    """
    logging.basicConfig(level=log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    ctx = zmq.Context(io_threads=1)
    out = ctx.socket(zmq.PUSH)
    out.setsockopt(zmq.LINGER, 2000)
    out.connect(output_address)
    inp = ctx.socket(zmq.PULL)
    inp.connect(input_address)
    encoder = msgspec.msgpack.Encoder()
    try:
        import torch

        torch.set_num_threads(max(1, torch_threads))
        loop = CoreLoop(EngineCore(engine_args))
        out.send(encoder.encode(loop.ready()))
    except BaseException as exc:
        if isinstance(exc, (ValueError, TypeError)):  # bad arguments: the front end says why
            logger.info("the engine core refused to start: %s", exc)
        else:
            logger.exception("the engine core could not start")
        out.send(encoder.encode(CoreFailed(type(exc).__name__, str(exc))))
        _close(ctx, out, inp)
        return
    decoder = input_decoder()
    poller = zmq.Poller()
    poller.register(inp, zmq.POLLIN)

    def receive(timeout: float) -> list[CoreInput]:
        msgs: list[CoreInput] = []
        if not poller.poll(int(timeout * 1000)):
            return msgs
        while True:
            try:
                raw = inp.recv(zmq.NOBLOCK)
            except zmq.Again:
                return msgs
            msgs.append(decoder.decode(raw))

    def parent_alive() -> bool:
        if os.getppid() != parent_pid:
            logger.warning("the front end is gone; the engine core exits")
            return False
        return True

    try:
        loop.run(receive, lambda o: out.send(encoder.encode(o)), parent_alive)
    except BaseException as exc:
        logger.exception("the engine core loop died")
        out.send(encoder.encode(CoreFailed(type(exc).__name__, f"{type(exc).__name__}: {exc}")))
    finally:
        try:
            loop.core.shutdown()
        finally:
            _close(ctx, out, inp)


def _close(ctx: zmq.Context[Any], *sockets: zmq.Socket[bytes]) -> None:
    for s in sockets:
        s.close()
    ctx.term()
