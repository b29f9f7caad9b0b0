"""The front end's one way to the engine core: ``EngineCoreClient``, one
protocol over three transports, made by ``make_core_client``.

- ``InProcessCoreClient`` (``"in_process"``): direct calls on an
  ``EngineCore`` of this process, stepped by the caller (``LLMEngine``): no
  copy, no serialization, errors raised at once.
- ``InThreadCoreClient`` (``"thread"``): the core's ``CoreLoop`` on a thread of
  this process; messages go through a queue as Python objects, outputs are
  handed to a callback on that thread.
- ``ProcessCoreClient`` (``"process"``): the core in its own process (spawn),
  msgpack frames over ZeroMQ (PUSH requests, PULL outputs); a thread of the
  front end receives the core's outputs and watches the process, so a core that
  dies (killed, out of memory, a fatal error) is reported once through
  ``on_dead`` and never leaves a caller waiting.

Every core operation crosses here: requests (sampling and beam search), aborts,
stop strings, and the ``UTILITY_METHODS`` (prefix-cache reset, counters), whose
answers come back as ``concurrent.futures.Future`` objects.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any, Literal, Protocol

from .core.core_proc import CoreLoop
from .core.engine_core import EngineCore
from .core.messages import (
    AddBeamSearchRequest,
    AddRequest,
    CoreReady,
    RequestDelta,
    check_utility,
)
from .core_loop_client import (
    EngineCoreStartError,
    InThreadCoreClient,
    OnDead,
    OnOutputs,
    ProcessCoreClient,
)

__all__ = [
    "EngineCoreClient",
    "EngineCoreStartError",
    "InProcessCoreClient",
    "InThreadCoreClient",
    "OnDead",
    "OnOutputs",
    "ProcessCoreClient",
    "make_core_client",
]

Transport = Literal["in_process", "thread", "process"]


class EngineCoreClient(Protocol):
    """What a front end may ask of its engine core, whatever the transport.

    Attributes:
        ready: the core's ``CoreReady`` (context length, vocabulary, counters).
    """

    ready: CoreReady

    @property
    def pid(self) -> int | None:
        """The engine core's process id (None: it runs in this process)."""
        ...

    def is_alive(self) -> bool:
        """True while the core serves."""
        ...

    def add_request(self, req: AddRequest) -> None:
        """Queue a sampling request the front end validated."""
        ...

    def add_beam_search_request(self, req: AddBeamSearchRequest) -> None:
        """Queue a beam search request the front end validated."""
        ...

    def abort_requests(self, request_ids: Sequence[str]) -> list[RequestDelta]:
        """Abort requests (unknown ids are ignored). Returns the deltas the
        aborts produced at once (an in-process beam search's hypotheses so
        far); the other transports free the blocks at the core's next step
        boundary and count the abort in that ``CoreOutputs.num_aborts``."""
        ...

    def stop_sequence(self, request_id: str, index: int, stop_reason: str | None) -> None:
        """Finish one sequence: its front end found a stop string."""
        ...

    def call(self, method: str) -> Future[Any]:
        """Call one of the core's ``UTILITY_METHODS`` between steps.

        Raises:
            ValueError: ``method`` is not one of them.
        """
        ...

    def close(self, timeout: float = 30.0) -> None:
        """Stop the core (idempotent)."""
        ...


def make_core_client(
    engine_args: Any,
    transport: Transport,
    *,
    torch_threads: int | None = None,
    log_level: str = "WARNING",
) -> InProcessCoreClient | InThreadCoreClient | ProcessCoreClient:
    """Build an engine core from ``engine_args`` and the client over it.

    Args:
        engine_args: the ``EngineArgs`` of the core.
        transport: ``"in_process"`` (stepped by the caller), ``"thread"`` or
            ``"process"`` (the core runs its own loop; call ``start``).
        torch_threads: torch threads of the core process (default: every CPU
            core); the other transports use this process's.
        log_level: logging level of the core process.
    Raises:
        ValueError: invalid engine arguments or model (the core's message), or
            an unknown transport.
        EngineCoreStartError: the core process died while starting.
    """
    if transport == "in_process":
        return InProcessCoreClient(EngineCore(engine_args))
    if transport == "thread":
        return InThreadCoreClient(EngineCore(engine_args))
    if transport == "process":
        threads = torch_threads or os.cpu_count() or 1
        return ProcessCoreClient(engine_args, threads, log_level=log_level)
    raise ValueError(f"transport must be 'in_process', 'thread' or 'process', got {transport!r}")


class InProcessCoreClient:
    """An ``EngineCore`` of this process, called directly and stepped by its
    caller (``step``).

    Args:
        core: the engine core; nothing else may change it.
    """

    def __init__(self, core: EngineCore) -> None:
        self.core = core
        self.ready = CoreLoop(core).ready()

    @property
    def pid(self) -> int | None:
        """None: the core has no process of its own."""
        return None

    def is_alive(self) -> bool:
        """True: the core lives as long as its caller."""
        return True

    def add_request(self, req: AddRequest) -> None:
        """Queue a sampling request (``EngineCore.add_request``; its errors raise here)."""
        self.core.add_request(req)

    def add_beam_search_request(self, req: AddBeamSearchRequest) -> None:
        """Queue a beam search (``EngineCore.add_beam_search_request``; its errors raise here)."""
        self.core.add_beam_search_request(req)

    def abort_requests(self, request_ids: Sequence[str]) -> list[RequestDelta]:
        """Abort at once; returns the beam searches' final deltas."""
        deltas = [self.core.abort_request(rid) for rid in request_ids]
        return [d for d in deltas if d is not None]

    def stop_sequence(self, request_id: str, index: int, stop_reason: str | None) -> None:
        """Finish one sequence at once (``EngineCore.stop_sequence``)."""
        self.core.stop_sequence(request_id, index, stop_reason)

    def call(self, method: str) -> Future[Any]:
        """Run the utility now; the future is done on return."""
        check_utility(method)
        fut: Future[Any] = Future()
        try:
            fut.set_result(getattr(self.core, method)())
        except Exception as exc:
            fut.set_exception(exc)
        return fut

    def has_unfinished_requests(self) -> bool:
        """True while any request is waiting or running."""
        return self.core.has_unfinished_requests()

    def step(self) -> list[RequestDelta]:
        """Run one step (``EngineCore.step``)."""
        return self.core.step()

    def close(self, timeout: float = 30.0) -> None:
        """Stop the executor's workers and the core's threads (idempotent)."""
        self.core.shutdown()
