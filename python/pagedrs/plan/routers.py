"""Routers of the simulated data-parallel replicas, each the rule the serving
stack runs: ``pagedrs`` is :func:`pagedrs.serve.routing.choose_replica` over a
:class:`~pagedrs.serve.routing.PrefixCacheIndex` fed by the replicas' KV
events, called as ``pagedrs.serve.router.PrefixCacheRouter`` calls them (block
hashes of the prompt from ``_core.block_hashes``, ``expect`` after each
decision) on the simulation's clock; ``power_of_two`` is Ray Serve's default
(the shorter queue of two random replicas); ``round_robin`` is
``pagedrs.serve.baseline_routers.RoundRobinRouter``'s order.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

import pagedrs._core as _core

from ..serve.routing import PrefixCacheIndex, RoutingConfig, choose_replica

__all__ = ["Router", "make_router"]


class Router:
    """Chooses a replica for each request.

    Args:
        policy: "pagedrs", "power_of_two" or "round_robin".
        num_replicas: replicas (0..n-1).
        block_size: the replicas' block size (for the prefix hashes).
        clock: the simulation's time, s.
        seed: random source of power of two choices.
    """

    def __init__(
        self,
        policy: str,
        num_replicas: int,
        block_size: int,
        clock: Callable[[], float],
        seed: int = 0,
        config: RoutingConfig | None = None,
    ) -> None:
        self.policy = policy
        self.n = num_replicas
        self.block_size = block_size
        self.rng = random.Random(seed)
        self.config = config or RoutingConfig()
        self.index: PrefixCacheIndex[int] = PrefixCacheIndex(clock=clock)
        self.decisions: Counter[str] = Counter()
        self._next = 0

    @property
    def wants_events(self) -> bool:
        """Whether replicas must record KV events for this router."""
        return self.policy == "pagedrs"

    def choose(self, prompt: np.ndarray, queue_lens: Sequence[int]) -> int:
        """The replica for a request with ``prompt`` token ids, given each
        replica's requests in flight."""
        if self.n == 1:
            return 0
        if self.policy == "round_robin":
            r = self._next % self.n
            self._next += 1
            self.decisions["round_robin"] += 1
            return r
        lens = dict(enumerate(queue_lens))
        if self.policy == "power_of_two":
            pick = self.rng.sample(range(self.n), 2)
            self.decisions["power_of_two"] += 1
            return min(pick, key=lambda r: lens[r])
        hashes = _core.block_hashes(prompt.tolist(), self.block_size)
        matched = self.index.matched_blocks(hashes, lens) if hashes else {}
        d = choose_replica(lens, matched, len(hashes), self.config, self.rng)
        self.decisions[d.reason] += 1
        if hashes:
            self.index.expect(d.replica, hashes)
        return d.replica

    def apply_events(self, replica: int, events: list[Any]) -> None:
        """A replica's ``Scheduler.take_kv_events()``, as the KV event
        subscriber applies them."""
        for ev in events:
            if ev.kind == "stored":
                self.index.stored(replica, ev.block_hashes)
            elif ev.kind == "removed":
                self.index.removed(replica, ev.block_hashes)
            else:
                self.index.cleared(replica)


def make_router(
    policy: str, num_replicas: int, block_size: int, clock: Callable[[], float], seed: int = 0
) -> Router:
    """A :class:`Router` (see its arguments)."""
    return Router(policy, num_replicas, block_size, clock, seed)
