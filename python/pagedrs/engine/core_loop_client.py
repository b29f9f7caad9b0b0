"""The two core-client transports whose engine core runs its own loop
(``CoreLoop``): ``InThreadCoreClient`` (a thread of this process, messages as
Python objects through a queue) and ``ProcessCoreClient`` (the engine-core
process, msgpack frames over ZeroMQ). Both follow ``core_client.EngineCoreClient``;
``make_core_client`` builds them.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import os
import queue
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import msgspec
import zmq

from .core.core_proc import CoreLoop, run_engine_core
from .core.engine_core import EngineCore
from .core.messages import (
    AbortRequests,
    AddBeamSearchRequest,
    AddRequest,
    CoreFailed,
    CoreInput,
    CoreOutputs,
    CoreReady,
    RequestDelta,
    Shutdown,
    StopSequence,
    UtilityCall,
    check_utility,
    output_decoder,
)

logger = logging.getLogger(__name__)

# How often the receiving thread checks that the core process lives (ms).
_WATCH_MS = 200

OnOutputs = Callable[[CoreOutputs], None]
OnDead = Callable[[str], None]


class EngineCoreStartError(RuntimeError):
    """The engine-core process exited before it was ready."""


class _LoopClient:
    """What the two transports whose core runs its own loop share: messages
    out, utility calls matched with their results, outputs to a callback."""

    ready: CoreReady

    def __init__(self) -> None:
        self._calls: dict[int, Future[Any]] = {}
        self._call_ids = itertools.count()
        self._calls_lock = threading.Lock()

    def _send(self, msg: CoreInput) -> None:
        raise NotImplementedError

    def add_request(self, req: AddRequest) -> None:
        """Send a sampling request; the core's refusal comes as a ``RequestError``."""
        self._send(req)

    def add_beam_search_request(self, req: AddBeamSearchRequest) -> None:
        """Send a beam search request; the core's refusal comes as a ``RequestError``."""
        self._send(req)

    def abort_requests(self, request_ids: Sequence[str]) -> list[RequestDelta]:
        """Send one ``AbortRequests``; returns [] (see ``EngineCoreClient``)."""
        self._send(AbortRequests(list(request_ids)))
        return []

    def stop_sequence(self, request_id: str, index: int, stop_reason: str | None) -> None:
        """Send a ``StopSequence``."""
        self._send(StopSequence(request_id, index, stop_reason))

    def call(self, method: str) -> Future[Any]:
        """Send a ``UtilityCall``; the future is done when its result arrives,
        or fails with ``RuntimeError`` if the core dies first."""
        check_utility(method)
        fut: Future[Any] = Future()
        with self._calls_lock:
            call_id = next(self._call_ids)
            self._calls[call_id] = fut
        self._send(UtilityCall(call_id, method))
        return fut

    def _deliver(self, out: CoreOutputs, on_outputs: OnOutputs) -> None:
        for res in out.results:
            with self._calls_lock:
                fut = self._calls.pop(res.call_id, None)
            if fut is None:
                continue
            if res.error is None:
                fut.set_result(res.result)
            else:
                fut.set_exception(RuntimeError(res.error))
        on_outputs(out)

    def _fail_calls(self, message: str) -> None:
        with self._calls_lock:
            calls, self._calls = list(self._calls.values()), {}
        for fut in calls:
            fut.set_exception(RuntimeError(message))


class ProcessCoreClient(_LoopClient):
    """The front end's handle on one engine-core process.

    Args:
        engine_args: the ``EngineArgs`` the core builds its engine from.
        torch_threads: torch threads of the core process.
        startup_timeout: seconds to wait for the core to build its engine.
        log_level: logging level of the core process.

    Raises:
        ValueError: the core refused the arguments or the model (its message).
        EngineCoreStartError: the core died or did not start in time.
    """

    def __init__(
        self,
        engine_args: Any,
        torch_threads: int,
        *,
        startup_timeout: float = 600.0,
        log_level: str = "WARNING",
    ) -> None:
        super().__init__()
        self._dir = tempfile.mkdtemp(prefix="pagedrs-core-")
        self._ctx = zmq.Context(io_threads=1)
        self._input = self._ctx.socket(zmq.PUSH)
        self._input.setsockopt(zmq.LINGER, 0)
        input_address = f"ipc://{self._dir}/input"
        self._input.bind(input_address)
        self._output = self._ctx.socket(zmq.PULL)
        output_address = f"ipc://{self._dir}/output"
        self._output.bind(output_address)
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = output_decoder()
        self._send_lock = threading.Lock()
        self._closed = False
        self._thread: threading.Thread | None = None
        mp = multiprocessing.get_context("spawn")
        self.process = mp.Process(
            target=run_engine_core,
            args=(engine_args, input_address, output_address, os.getpid(), torch_threads),
            kwargs={"log_level": log_level},
            name="pagedrs-engine-core",
        )
        self.process.start()
        try:
            self.ready = self._wait_ready(startup_timeout)
        except BaseException:
            self.close()
            raise

    @property
    def pid(self) -> int | None:
        """The engine-core process's id."""
        return self.process.pid

    def is_alive(self) -> bool:
        """True while the engine-core process runs."""
        return self.process.is_alive()

    def _wait_ready(self, timeout: float) -> CoreReady:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._output.poll(_WATCH_MS):
                msg = self._decoder.decode(self._output.recv())
                if isinstance(msg, CoreReady):
                    return msg
                if isinstance(msg, CoreFailed):
                    if msg.kind in ("ValueError", "TypeError"):
                        raise ValueError(msg.message)
                    raise EngineCoreStartError(f"{msg.kind}: {msg.message}")
            elif not self.process.is_alive():
                raise EngineCoreStartError(
                    f"the engine core exited with code {self.process.exitcode} before it was ready"
                )
        raise EngineCoreStartError(f"the engine core was not ready within {timeout:.0f} s")

    def start(self, on_outputs: OnOutputs, on_dead: OnDead) -> None:
        """Start the receiving thread: ``on_outputs`` for every step's outputs,
        then ``on_dead(message)`` once if the core fails or exits unasked."""
        self._thread = threading.Thread(
            target=self._receive, args=(on_outputs, on_dead), name="pagedrs-core-outputs"
        )
        self._thread.daemon = True
        self._thread.start()

    def _receive(self, on_outputs: OnOutputs, on_dead: OnDead) -> None:
        def dead(message: str) -> None:
            self._fail_calls(message)
            on_dead(message)

        try:
            while not self._closed:
                if not self._output.poll(_WATCH_MS):
                    if not self.process.is_alive() and not self._closed:
                        dead(f"the engine core exited with code {self.process.exitcode}")
                        return
                    continue
                msg = self._decoder.decode(self._output.recv())
                if isinstance(msg, CoreOutputs):
                    self._deliver(msg, on_outputs)
                elif isinstance(msg, CoreFailed):
                    dead(f"the engine core failed: {msg.message}")
                    return
        except BaseException as exc:  # the front end's own handling broke
            logger.exception("the engine core's output thread died")
            if not self._closed:
                dead(f"the engine core's output thread died: {type(exc).__name__}: {exc}")

    def _send(self, msg: CoreInput) -> None:
        data = self._encoder.encode(msg)
        with self._send_lock:
            if not self._closed:
                self._input.send(data)

    def close(self, timeout: float = 30.0) -> None:
        """Ask the core to exit, wait up to ``timeout`` seconds, then kill it;
        close the sockets (idempotent)."""
        if self._closed:
            return
        if self.process.is_alive():
            try:
                with self._send_lock:
                    self._input.send(self._encoder.encode(Shutdown()), zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
            self.process.join(timeout)
            if self.process.is_alive():
                logger.warning("the engine core did not exit in %.0f s; killing it", timeout)
                self.process.kill()
                self.process.join(5)
        with self._send_lock:
            self._closed = True
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(2 * _WATCH_MS / 1000)
        self._input.close()
        self._output.close()
        self._ctx.term()
        shutil.rmtree(self._dir, ignore_errors=True)
        self._fail_calls("the engine core was closed")


class InThreadCoreClient(_LoopClient):
    """An engine core on a thread of this process (``CoreLoop`` over a queue).

    Args:
        core: the engine core to drive; nothing else may call it afterwards.
    """

    def __init__(self, core: EngineCore) -> None:
        super().__init__()
        self.loop = CoreLoop(core)
        self.core = core
        self.ready = self.loop.ready()
        self._inbox: queue.SimpleQueue[CoreInput] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._closed = False

    @property
    def pid(self) -> int | None:
        """None: the core has no process of its own."""
        return None

    def is_alive(self) -> bool:
        """True while the core's thread runs."""
        return self._thread is not None and self._thread.is_alive()

    def start(self, on_outputs: OnOutputs, on_dead: OnDead) -> None:
        """Start the core's thread: it calls ``on_outputs`` after every step,
        and ``on_dead(message)`` once if its loop dies."""
        self._thread = threading.Thread(
            target=self._run, args=(on_outputs, on_dead), name="pagedrs-engine-core"
        )
        self._thread.daemon = True
        self._thread.start()

    def _receive(self, timeout: float) -> list[CoreInput]:
        msgs: list[CoreInput] = []
        try:
            msgs.append(
                self._inbox.get(timeout=timeout) if timeout > 0 else self._inbox.get_nowait()
            )
        except queue.Empty:
            return msgs
        while True:
            try:
                msgs.append(self._inbox.get_nowait())
            except queue.Empty:
                return msgs

    def _run(self, on_outputs: OnOutputs, on_dead: OnDead) -> None:
        try:
            self.loop.run(self._receive, lambda out: self._deliver(out, on_outputs))
        except BaseException as exc:  # the loop itself broke: nothing can run
            logger.exception("the engine core's thread died")
            message = f"the engine loop died: {type(exc).__name__}: {exc}"
            self._fail_calls(message)
            if not self._closed:
                on_dead(message)
        finally:
            try:
                self.core.shutdown()  # tensor-parallel workers, if any
            except BaseException:
                logger.exception("engine shutdown failed")

    def _send(self, msg: CoreInput) -> None:
        if not self._closed:
            self._inbox.put(msg)

    def close(self, timeout: float = 30.0) -> None:
        """Stop the core after its current step, abort what is left, join the
        thread (idempotent)."""
        if self._closed:
            return
        self._inbox.put(Shutdown())
        self._closed = True
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        self._fail_calls("the engine core was closed")
