"""One data-parallel engine replica as a Ray Serve deployment.

:class:`EngineReplica` runs an :class:`~pagedrs.engine.async_llm.AsyncLLM`
(the engine core in a process of its own) with KV events on: it picks two free
TCP ports on its node, publishes its prefix-cache events there with its replica
rank as ``data_parallel_rank``, and reports the endpoints to routers through
Ray Serve's routing stats (``record_routing_stats``). Requests arrive as
:class:`ReplicaRequest` (prompt already tokenized by the ingress); outputs
leave as :class:`ReplicaOutput` (cumulative ``RequestOutput`` objects, the last
with the replica's ``kv_cache_stats()``).
"""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from ..engine.arg_utils import EngineArgs
from ..inputs import TokensPrompt
from ..lora.request import LoRARequest
from ..outputs import RequestOutput
from ..sampling_params import BeamSearchParams, SamplingParams

logger = logging.getLogger(__name__)

__all__ = ["EngineReplica", "ReplicaInfo", "ReplicaOutput", "ReplicaRequest"]

#: The topic replicas publish their KV events on.
KV_EVENTS_TOPIC = "kv-events"


@dataclass
class ReplicaRequest:
    """One engine request, as the ingress sends it to a replica.

    Attributes:
        prompt: the prompt text (after the chat template), or None when given
            as token ids (routers that match text, such as Ray's
            ``PrefixCacheAffinityRouter``, read it).
        prompt_token_ids: the prompt's token ids (the prefix-cache router
            hashes them).
        sampling_params: how to sample (or to search, for beam search).
        request_id: the caller's id.
        cache_salt: per-tenant salt of the prefix cache.
        arrival_time: seconds since the epoch.
        priority: lower runs first under the priority scheduling policy.
        lora_request: the LoRA adapter it runs with (replicas started with
            ``enable_lora``), or None; the prefix-cache router hashes its id.
    """

    prompt: str | None
    prompt_token_ids: list[int]
    sampling_params: SamplingParams | BeamSearchParams
    request_id: str
    cache_salt: str | None = None
    arrival_time: float | None = None
    priority: int = 0
    lora_request: LoRARequest | None = None


@dataclass
class ReplicaOutput:
    """One streamed output of a replica.

    Attributes:
        output: the request's cumulative output.
        rank: the replica's rank (its KV events' ``data_parallel_rank``).
        kv_cache_stats: the replica's ``kv_cache_stats()``, with the finished
            output only (else None).
    """

    output: RequestOutput
    rank: int
    kv_cache_stats: dict[str, Any] | None = None


@dataclass
class ReplicaInfo:
    """What the ingress needs to know of the replicas' engine (all alike).

    Attributes:
        max_model_len: longest sequence, in tokens.
        vocab_size: vocabulary size, in tokens.
        max_num_seqs: most sequences per step.
        block_size: tokens per KV block.
        scheduling_policy: "fcfs" or "priority".
        engine_args: the replica's engine arguments (as a dict).
    """

    max_model_len: int
    vocab_size: int
    max_num_seqs: int
    block_size: int
    scheduling_policy: str
    engine_args: dict[str, Any] = field(default_factory=dict)


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _replica_rank() -> int:
    """This replica's rank in its deployment (0 outside Ray Serve)."""
    from ray import serve

    try:
        rank: Any = serve.get_replica_context().rank
    except RuntimeError:
        return 0
    return int(rank.rank) if hasattr(rank, "rank") else int(rank)


class EngineReplica:
    """An engine replica: ``AsyncLLM`` with KV events on its own TCP ports.

    Args:
        engine_args: ``EngineArgs`` fields (``kv_events_config``'s topic,
            buffer and high-water mark are kept; its endpoints are replaced by
            free ports of this node; ``data_parallel_rank`` is this replica's rank).
        max_waiting_requests: bound of the replica's waiting queue.
        torch_threads: torch threads of the engine core.
        log_level: logging level of the engine core.
    Raises:
        ValueError: invalid engine arguments or model.
    """

    def __init__(
        self,
        engine_args: dict[str, Any],
        max_waiting_requests: int = 1024,
        torch_threads: int = 1,
        log_level: str = "WARNING",
    ) -> None:
        import ray
        import torch

        from ..engine.async_llm import AsyncLLM

        torch.set_num_threads(1)  # this process runs no model
        self.rank = _replica_rank()
        host = ray.util.get_node_ip_address()
        given = json.loads(engine_args.get("kv_events_config") or "{}")
        pub, replay = _free_port(host), _free_port(host)
        events = {
            **given,
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": f"tcp://{host}:{pub}",
            "replay_endpoint": f"tcp://{host}:{replay}",
            "topic": given.get("topic", KV_EVENTS_TOPIC),
        }
        args = EngineArgs(
            **{
                **engine_args,
                "kv_events_config": json.dumps(events),
                "data_parallel_rank": self.rank,
            }
        )
        self._events = events
        self.engine = AsyncLLM(
            args,
            max_waiting_requests=max_waiting_requests,
            torch_threads=torch_threads,
            log_level=log_level,
        )
        self.args = args
        logger.info("engine replica %d: KV events on %s", self.rank, events["endpoint"])

    def info(self) -> ReplicaInfo:
        """The engine's limits and arguments."""
        return ReplicaInfo(
            max_model_len=self.engine.max_model_len,
            vocab_size=self.engine.vocab_size,
            max_num_seqs=self.engine.max_num_seqs,
            block_size=self.args.block_size,
            scheduling_policy=self.args.scheduling_policy,
            engine_args={k: v for k, v in vars(self.args).items() if not k.startswith("_")},
        )

    def kv_cache_stats(self) -> dict[str, Any]:
        """The engine's ``kv_cache_stats()`` as of its last step."""
        return self.engine.kv_cache_stats()

    def record_routing_stats(self) -> dict[str, Any]:
        """Ray Serve's routing stats, read by routers: the KV event endpoints
        (``kv_events_endpoint``, ``kv_events_replay_endpoint``,
        ``kv_events_topic``), ``block_size``, ``data_parallel_rank`` and
        ``num_waiting`` (requests not yet scheduled)."""
        return {
            "kv_events_endpoint": self._events["endpoint"],
            "kv_events_replay_endpoint": self._events["replay_endpoint"],
            "kv_events_topic": self._events["topic"],
            "block_size": self.args.block_size,
            "data_parallel_rank": self.rank,
            "num_waiting": self.engine.num_waiting_requests(),
        }

    async def check_health(self) -> None:
        """Ray Serve's health check: raises once the engine core has died, so
        that Ray replaces this replica.

        Raises:
            EngineDeadError: the engine core stopped.
        """
        await self.engine.check_health()

    async def generate(self, request: ReplicaRequest) -> AsyncIterator[ReplicaOutput]:
        """Run one request; yield its cumulative outputs, the finished one with
        this replica's ``kv_cache_stats()``. Cancelling the stream aborts it.

        Raises:
            as ``AsyncLLM.generate``: QueueFullError, ValueError,
            RequestFailedError, EngineDeadError.
        """
        prompt = TokensPrompt(prompt_token_ids=request.prompt_token_ids)
        if request.prompt is not None:
            prompt["prompt"] = request.prompt
        async for out in self.engine.generate(
            prompt,
            request.sampling_params,
            request.request_id,
            cache_salt=request.cache_salt,
            arrival_time=request.arrival_time,
            priority=request.priority,
            lora_request=request.lora_request,
        ):
            stats = self.engine.kv_cache_stats() if out.finished else None
            yield ReplicaOutput(out, self.rank, stats)

    def __del__(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.shutdown(timeout=10.0)
