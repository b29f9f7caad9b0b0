"""``PrefixCacheRouter``: a Ray Serve request router that sends a request to
the engine replica holding the longest prefix of it, balanced against load.

It subscribes to every replica's KV events (the endpoints each
:class:`~pagedrs.serve.replica.EngineReplica` reports in its routing stats)
and keeps block hash -> replicas in a
:class:`~pagedrs.serve.routing.PrefixCacheIndex`. For a request
(:class:`~pagedrs.serve.replica.ReplicaRequest`) it computes the block hashes
with the engine's own function, ``pagedrs._core.block_hashes(token_ids,
block_size, cache_salt, lora_id)``, so the router and the replicas name blocks
alike (a request of a LoRA adapter goes where that adapter's blocks are),
and applies :func:`~pagedrs.serve.routing.choose_replica` over the replicas'
queue lengths (Ray Serve's requests in flight per replica). A replica whose
actor died is dropped from routing and its blocks forgotten.

    serve.deployment(EngineReplica).options(
        request_router_config=RequestRouterConfig(
            request_router_class="pagedrs.serve.router:PrefixCacheRouter",
            request_router_kwargs={"match_threshold": 0.1},
        ))
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

from ray.serve.request_router import (
    FIFOMixin,
    PendingRequest,
    ReplicaID,
    RequestRouter,
    RunningReplica,
)

import pagedrs._core as _core

from .kv_subscriber import KVEventSubscriber
from .replica import KV_EVENTS_TOPIC, ReplicaRequest
from .routing import PrefixCacheIndex, RoutingConfig, choose_replica

logger = logging.getLogger(__name__)

__all__ = ["PrefixCacheRouter"]


def request_of(pending: PendingRequest | None) -> ReplicaRequest | None:
    """The ``ReplicaRequest`` among a pending request's arguments, if any."""
    if pending is None:
        return None
    for arg in [*pending.args, *pending.kwargs.values()]:
        if isinstance(arg, ReplicaRequest):
            return arg
    return None


class PrefixCacheRouter(FIFOMixin, RequestRouter):
    """Routes by the replicas' cached block hashes (see the module).

    ``request_router_kwargs`` are :class:`~pagedrs.serve.routing.RoutingConfig`'s
    fields and ``expect_ttl_s`` (:class:`~pagedrs.serve.routing.PrefixCacheIndex`).
    """

    def initialize_state(
        self,
        balance_abs_threshold: int = 2,
        balance_rel_threshold: float = 1.5,
        match_threshold: float = 0.1,
        expect_ttl_s: float = 5.0,
        **_: Any,
    ) -> None:
        self.routing_config = RoutingConfig(
            balance_abs_threshold, balance_rel_threshold, match_threshold
        )
        self.index: PrefixCacheIndex[ReplicaID] = PrefixCacheIndex(expect_ttl_s)
        self.decisions: Counter[str] = Counter()
        self._subscriber: KVEventSubscriber | None = None
        self._endpoints: dict[ReplicaID, str] = {}
        self._block_size: int | None = None

    # ----------------------------------------------------------- KV events

    def _sync_subscriptions(self, replicas: list[RunningReplica]) -> None:
        """Subscribe to the KV events of replicas whose endpoint is new."""
        for r in replicas:
            stats = r.routing_stats or {}
            endpoint = stats.get("kv_events_endpoint")
            if not endpoint or self._endpoints.get(r.replica_id) == endpoint:
                continue
            if self._subscriber is None:
                topic = stats.get("kv_events_topic", KV_EVENTS_TOPIC)
                self._subscriber = KVEventSubscriber(self.index, topic)
            self._subscriber.add(r.replica_id, endpoint, stats.get("kv_events_replay_endpoint"))
            self._endpoints[r.replica_id] = endpoint
            self._block_size = int(stats.get("block_size", 16))
            logger.info("prefix-cache router: KV events of %s from %s", r.replica_id, endpoint)

    def _forget(self, replica_id: ReplicaID) -> None:
        if self._endpoints.pop(replica_id, None) is not None and self._subscriber is not None:
            self._subscriber.remove(replica_id)
        self.index.cleared(replica_id)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        live = {r.replica_id for r in replicas}
        for rid in [rid for rid in self._endpoints if rid not in live]:
            self._forget(rid)
        self._sync_subscriptions(replicas)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._forget(replica_id)

    # -------------------------------------------------------------- routing

    async def _queue_lens(self, replicas: list[RunningReplica]) -> dict[ReplicaID, int]:
        """Each replica's requests in flight: from Ray's cache, else probed;
        a replica that does not answer is left out."""
        lens: dict[ReplicaID, int] = {}
        missing = []
        for r in replicas:
            q = self._replica_queue_len_cache.get(r.replica_id)
            if q is None:
                missing.append(r)
            else:
                lens[r.replica_id] = q
        if missing:
            for r, q in await self._probe_queue_lens(missing, 0):
                if q is not None:
                    lens[r.replica_id] = q
        return lens

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        """The chosen replica first, the others after it by queue length."""
        if not candidate_replicas:
            return []
        self._sync_subscriptions(candidate_replicas)
        lens = await self._queue_lens(candidate_replicas)
        if not lens:
            return [candidate_replicas]
        request = request_of(pending_request)
        hashes: list[bytes] = []
        if request is not None and self._block_size:
            lora = request.lora_request
            hashes = _core.block_hashes(
                request.prompt_token_ids,
                self._block_size,
                request.cache_salt,
                lora.lora_int_id if lora is not None else 0,
            )
        matched = self.index.matched_blocks(hashes, lens) if hashes else {}
        decision = choose_replica(lens, matched, len(hashes), self.routing_config)
        self.decisions[decision.reason] += 1
        if hashes:
            self.index.expect(decision.replica, hashes)
        by_id = {r.replica_id: r for r in candidate_replicas}
        rest = sorted(
            (r for r in candidate_replicas if r.replica_id != decision.replica),
            key=lambda r: lens.get(r.replica_id, 1 << 30),
        )
        return [[by_id[decision.replica]], rest] if rest else [[by_id[decision.replica]]]
