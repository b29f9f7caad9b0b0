"""The clients through which ``AsyncLLM`` talks to its engine core.

``EngineCoreClient`` starts the engine-core process and talks to it over
ZeroMQ (PUSH requests, PULL outputs, msgpack frames); a thread of the front end
receives the core's outputs and hands them to a callback; it also watches the
process, so a core that dies (killed, out of memory, a fatal error) is reported
once through ``on_dead`` and never leaves a caller waiting.

``InThreadCoreClient`` runs the same ``CoreLoop`` on a thread of the caller's
process: messages go through a queue as Python objects, outputs are handed to
the callback on that thread.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import queue
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import msgspec
import zmq

from .core.core_proc import CoreLoop, run_engine_core
from .core.messages import CoreFailed, CoreInput, CoreOutputs, CoreReady, Shutdown, output_decoder

logger = logging.getLogger(__name__)

# How often the receiving thread checks that the core process lives (ms).
_WATCH_MS = 200


OnOutputs = Callable[[CoreOutputs], None]
OnDead = Callable[[str], None]


class EngineCoreStartError(RuntimeError):
    """The engine-core process exited before it was ready."""


class CoreClient(Protocol):
    """What ``AsyncLLM`` needs of a core client.

    Attributes:
        ready: the core's ``CoreReady`` (context length, vocabulary, counters).
    """

    ready: CoreReady

    @property
    def pid(self) -> int | None:
        """The engine core's process id."""
        ...

    def is_alive(self) -> bool:
        """True while the core serves."""
        ...

    def start(self, on_outputs: OnOutputs, on_dead: OnDead) -> None:
        """Start delivering outputs to ``on_outputs``, then ``on_dead(message)``
        once if the core fails or stops unasked."""
        ...

    def send(self, msg: CoreInput) -> None:
        """Send one message to the core (any thread)."""
        ...

    def close(self, timeout: float = 30.0) -> None:
        """Stop the core (idempotent)."""
        ...


class EngineCoreClient:
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

    def start(
        self, on_outputs: Callable[[CoreOutputs], None], on_dead: Callable[[str], None]
    ) -> None:
        """Start the receiving thread: ``on_outputs`` for every step's outputs,
        then ``on_dead(message)`` once if the core fails or exits unasked."""
        self._thread = threading.Thread(
            target=self._receive, args=(on_outputs, on_dead), name="pagedrs-core-outputs"
        )
        self._thread.daemon = True
        self._thread.start()

    def _receive(
        self, on_outputs: Callable[[CoreOutputs], None], on_dead: Callable[[str], None]
    ) -> None:
        try:
            while not self._closed:
                if not self._output.poll(_WATCH_MS):
                    if not self.process.is_alive() and not self._closed:
                        on_dead(f"the engine core exited with code {self.process.exitcode}")
                        return
                    continue
                msg = self._decoder.decode(self._output.recv())
                if isinstance(msg, CoreOutputs):
                    on_outputs(msg)
                elif isinstance(msg, CoreFailed):
                    on_dead(f"the engine core failed: {msg.message}")
                    return
        except BaseException as exc:  # the front end's own handling broke
            logger.exception("the engine core's output thread died")
            if not self._closed:
                on_dead(f"the engine core's output thread died: {type(exc).__name__}: {exc}")

    def send(self, msg: CoreInput) -> None:
        """Send one message to the core (any thread)."""
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


class InThreadCoreClient:
    """An engine core on a thread of this process (``CoreLoop`` over a queue).

    Args:
        core: the engine core to drive; nothing else may call it afterwards.
    """

    def __init__(self, core: Any) -> None:
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
            self.loop.run(self._receive, on_outputs)
        except BaseException as exc:  # the loop itself broke: nothing can run
            logger.exception("the engine core's thread died")
            if not self._closed:
                on_dead(f"the engine loop died: {type(exc).__name__}: {exc}")
        finally:
            try:
                self.core.shutdown()  # tensor-parallel workers, if any
            except BaseException:
                logger.exception("engine shutdown failed")

    def send(self, msg: CoreInput) -> None:
        """Queue one message for the core (any thread)."""
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
