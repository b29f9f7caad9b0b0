"""``ReplicaPoolClient``: the OpenAI server's ``EngineClient`` over a Ray Serve
handle of engine replicas.

The server's handlers (``pagedrs.entrypoints.openai``) tokenize and check a
request as for one engine, then call :meth:`ReplicaPoolClient.generate`, which
sends a :class:`~pagedrs.serve.replica.ReplicaRequest` through the handle (the
deployment's request router picks the replica) and streams the replica's
outputs back.

Faults: when the replica dies (its actor, or its engine core) before any output
came, the request is sent again (Ray's router no longer offers a dead actor),
up to ``max_attempts`` times; after an output, or past the attempts, it fails
with ``EngineDeadError`` naming the replica (HTTP 503, or an error event in a
stream).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

from ray import exceptions as ray_exceptions

from ..engine.async_base import EngineDeadError, QueueFullError
from ..engine.validation import InvalidRequestError, check_priority
from ..inputs import PromptType, parse_prompt
from ..lora.request import LoRARequest
from ..outputs import RequestOutput
from ..sampling_params import BeamSearchParams, SamplingParams
from .replica import ReplicaInfo, ReplicaOutput, ReplicaRequest

logger = logging.getLogger(__name__)

__all__ = ["ReplicaPoolClient"]

# Summed over replicas in ``kv_cache_stats`` (the others are taken from one replica).
_SUMMED = (
    "num_running",
    "num_waiting",
    "num_swapped",
    "num_free_blocks",
    "num_used_blocks",
    "num_total_blocks",
    "prefix_cache_queries",
    "prefix_cache_hits",
    "num_preemptions",
    "weight_bytes",
    "kv_cache_total_bytes",
    "kv_cache_used_bytes",
    "kv_cache_free_bytes",
    "lora_bytes",  # LoRA (pagedrs.lora): each replica holds its own adapters
    "lora_slot_bytes",
    "lora_reserved_bytes",
    "num_loaded_loras",
)

_REPLICA_GONE = (ray_exceptions.RayActorError, ray_exceptions.ActorUnavailableError)


def _cause(exc: BaseException) -> BaseException:
    """The replica's own exception inside Ray's wrapper."""
    if isinstance(exc, ray_exceptions.RayTaskError):
        cause = exc.cause
        if isinstance(cause, BaseException):
            return cause
    return exc


class ReplicaPoolClient:
    """An ``EngineClient`` whose requests go to engine replicas.

    Args:
        handle: a ``DeploymentHandle`` of :class:`~pagedrs.serve.replica.EngineReplica`.
        info: the replicas' engine limits (``EngineReplica.info``).
        tokenizer: the replicas' tokenizer (the ingress tokenizes).
        max_waiting_requests: prompts one HTTP request may carry.
        max_attempts: tries of a request whose replica died before any output.
    """

    def __init__(
        self,
        handle: Any,
        info: ReplicaInfo,
        tokenizer: Any,
        max_waiting_requests: int = 1024,
        max_attempts: int = 2,
    ) -> None:
        self._handle = handle.options(stream=True)
        self.info = info
        self.tokenizer = tokenizer
        self.max_model_len = info.max_model_len
        self.max_waiting_requests = max_waiting_requests
        self.max_attempts = max_attempts
        self._listeners: list[Callable[[RequestOutput], None]] = []
        self._responses: dict[str, Any] = {}
        self._stats: dict[int, dict[str, Any]] = {}  # by replica rank
        self._lock = threading.Lock()
        self._stopped = False

    @property
    def is_running(self) -> bool:
        """True until :meth:`shutdown` (replicas are replaced by Ray Serve)."""
        return not self._stopped

    @property
    def max_num_seqs(self) -> int:
        """Most sequences per step of one replica."""
        return self.info.max_num_seqs

    @property
    def vocab_size(self) -> int:
        """Vocabulary size, in tokens."""
        return self.info.vocab_size

    def add_output_listener(self, listener: Callable[[RequestOutput], None]) -> None:
        """Call ``listener(output)`` for every output the replicas stream here."""
        self._listeners.append(listener)

    def kv_cache_stats(self) -> dict[str, Any]:
        """The replicas' ``kv_cache_stats()`` as of each one's last finished
        request here: counts summed over replicas, ``per_replica`` each one's
        (by rank)."""
        with self._lock:
            per = {rank: dict(s) for rank, s in sorted(self._stats.items())}
        total: dict[str, Any] = {}
        for s in per.values():
            for k, v in s.items():
                if k in _SUMMED:
                    total[k] = total.get(k, 0) + v
                elif k not in total and isinstance(v, int | float):
                    total[k] = v
        total["per_replica"] = per
        return total

    def num_waiting_requests(self) -> int:
        """Requests waiting in the replicas (as of their last report)."""
        return int(self.kv_cache_stats().get("num_waiting", 0))

    def check_priority(self, priority: int) -> None:
        """Raises:
        ValueError: as ``validation.check_priority``."""
        check_priority(priority, self.info.scheduling_policy)

    async def check_health(self) -> None:
        """Raises:
        EngineDeadError: after :meth:`shutdown`."""
        if self._stopped:
            raise EngineDeadError("the server is shutting down")

    async def generate(
        self,
        prompt: PromptType,
        sampling_params: SamplingParams | BeamSearchParams,
        request_id: str,
        *,
        cache_salt: str | None = None,
        arrival_time: float | None = None,
        priority: int = 0,
        lora_request: LoRARequest | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Run one request on a replica the router picks; yield its cumulative
        outputs. Leaving the iteration early cancels it on the replica.

        Raises:
            QueueFullError, ValueError, RequestFailedError: the replica's.
            EngineDeadError: the replica died (after an output, or on every
                attempt), or the server is shutting down.
        """
        if self._stopped:
            raise EngineDeadError("the server is shutting down")
        try:
            text, ids, salt = parse_prompt(prompt)
        except (TypeError, ValueError) as exc:
            raise InvalidRequestError(str(exc), param="prompt") from None
        if ids is None:
            ids = list(self.tokenizer(text).input_ids)
        request = ReplicaRequest(
            text,
            ids,
            sampling_params,
            request_id,
            cache_salt if cache_salt is not None else salt,
            arrival_time,
            int(priority),
            lora_request,  # LoRA (pagedrs.lora): the router hashes its id
        )
        for attempt in range(1, self.max_attempts + 1):
            response = self._handle.generate.remote(request)
            self._responses[request_id] = response
            streamed = False
            try:
                async for item in response:
                    streamed = True
                    yield self._observe(item)
                return
            except _REPLICA_GONE as exc:
                if streamed or attempt == self.max_attempts:
                    raise EngineDeadError(
                        f"the engine replica serving request {request_id} died: "
                        f"{type(exc).__name__}"
                    ) from None
                logger.warning("request %s: replica died before any output; retrying", request_id)
            except ray_exceptions.RayTaskError as exc:
                cause = _cause(exc)
                if isinstance(cause, EngineDeadError) and not streamed:
                    if attempt < self.max_attempts:
                        logger.warning("request %s: engine core died; retrying", request_id)
                        continue
                if isinstance(cause, EngineDeadError | QueueFullError | ValueError):
                    raise type(cause)(*cause.args) from None
                raise cause from None
            finally:
                if self._responses.get(request_id) is response:
                    del self._responses[request_id]
                response.cancel()

    def _observe(self, item: ReplicaOutput) -> RequestOutput:
        if item.kv_cache_stats is not None:
            with self._lock:
                self._stats[item.rank] = item.kv_cache_stats
        for listener in self._listeners:
            try:
                listener(item.output)
            except Exception:
                logger.exception("output listener failed")
        return item.output

    async def abort(self, request_id: str) -> None:
        """Cancel a request on its replica (unknown ids are ignored)."""
        response = self._responses.pop(request_id, None)
        if response is not None:
            response.cancel()

    async def reset_prefix_cache(self) -> bool:
        """Raises:
        NotImplementedError: a handle call reaches one replica, chosen by the
            router; the replicas' caches cannot be reset together through it."""
        raise NotImplementedError(
            "reset_prefix_cache is not supported over Ray Serve replicas: a call reaches "
            "one replica only"
        )

    def shutdown(self, timeout: float | None = 60.0) -> None:
        """Refuse new requests and cancel the open ones (the replicas stay up:
        Ray Serve owns them)."""
        self._stopped = True
        for response in list(self._responses.values()):
            response.cancel()
        self._responses.clear()
