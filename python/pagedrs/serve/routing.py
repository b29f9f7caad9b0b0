"""The prefix-cache-aware routing rule, free of Ray: which replica holds which
block, and which replica a request goes to.

:class:`PrefixCacheIndex` keeps, from the replicas' KV events
(:mod:`pagedrs.kv_events`), the set of replicas holding each block
hash. :func:`choose_replica` applies the rule (as SGLang's cache-aware router,
on exact block hashes instead of an approximate radix tree):

1. **Load imbalance first.** With ``q`` the replicas' queue lengths (requests
   in flight), the load is imbalanced when ``max(q) - min(q) >
   balance_abs_threshold`` and ``max(q) > balance_rel_threshold * min(q)``; the
   request then goes to the least loaded replica, whatever the cache holds.
2. **Else the longest cached prefix**, if its match ratio (cached leading
   blocks / the request's full blocks) is at least ``match_threshold``: the
   replica holding the most leading blocks of the request, ties to the shorter
   queue.
3. **Else power of two choices**: the shorter queue of two replicas drawn at
   random.

A request with no full block (shorter than ``block_size`` tokens) goes by
power of two choices.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

R = TypeVar("R", bound=Hashable)

__all__ = ["PrefixCacheIndex", "RoutingConfig", "RoutingDecision", "choose_replica"]


@dataclass(frozen=True)
class RoutingConfig:
    """Thresholds of :func:`choose_replica`.

    Attributes:
        balance_abs_threshold: queue-length difference (requests) above which
            the load may be imbalanced.
        balance_rel_threshold: ratio of the longest to the shortest queue above
            which the load may be imbalanced (both must hold).
        match_threshold: least fraction (0-1) of the request's full blocks the
            best replica must hold for the cache to decide.
    Raises:
        ValueError: a negative threshold, ``balance_rel_threshold`` < 1 or
            ``match_threshold`` > 1.
    """

    balance_abs_threshold: int = 2
    balance_rel_threshold: float = 1.5
    match_threshold: float = 0.1

    def __post_init__(self) -> None:
        if self.balance_abs_threshold < 0:
            raise ValueError("balance_abs_threshold must be >= 0")
        if not self.balance_rel_threshold >= 1.0:
            raise ValueError("balance_rel_threshold must be >= 1")
        if not 0.0 <= self.match_threshold <= 1.0:
            raise ValueError("match_threshold must be in [0, 1]")


@dataclass(frozen=True)
class RoutingDecision(Generic[R]):
    """Where a request goes and why.

    Attributes:
        replica: the chosen replica.
        reason: "imbalanced", "prefix" or "power_of_two".
        matched_blocks: leading blocks of the request ``replica`` holds.
    """

    replica: R
    reason: str
    matched_blocks: int


class PrefixCacheIndex(Generic[R]):
    """Block hash -> the replicas whose prefix cache holds it; thread-safe (KV
    event subscribers apply events from their threads, routing reads).

    Besides the blocks the events report, the index holds *expected* blocks:
    those of a request just routed to a replica, which its events report only
    once the prompt is computed. They count as held for ``expect_ttl_s``
    seconds, so that requests sharing a new prefix that arrive together follow
    the first one.

    Args:
        expect_ttl_s: seconds an expected block counts as held (0: never).
        clock: the time source of the expiry, in seconds.
    """

    def __init__(self, expect_ttl_s: float = 5.0, clock: Callable[[], float] = time.monotonic):
        self._holders: dict[bytes, set[R]] = {}
        self._blocks: dict[R, set[bytes]] = {}
        self._expected: dict[tuple[bytes, R], float] = {}
        self._expect_ttl_s = expect_ttl_s
        self._clock = clock
        self._lock = threading.Lock()

    def expect(self, replica: R, block_hashes: Iterable[bytes]) -> None:
        """A request with these blocks was routed to ``replica``: count them
        as held there for ``expect_ttl_s`` seconds."""
        if self._expect_ttl_s <= 0:
            return
        now = self._clock()
        until = now + self._expect_ttl_s
        with self._lock:
            if len(self._expected) > 100_000:
                self._expected = {k: t for k, t in self._expected.items() if t > now}
            for h in block_hashes:
                self._expected[(h, replica)] = until

    def stored(self, replica: R, block_hashes: Iterable[bytes]) -> None:
        """``BlockStored``: ``replica`` caches these blocks."""
        with self._lock:
            mine = self._blocks.setdefault(replica, set())
            for h in block_hashes:
                self._holders.setdefault(h, set()).add(replica)
                mine.add(h)

    def removed(self, replica: R, block_hashes: Iterable[bytes]) -> None:
        """``BlockRemoved``: ``replica`` evicted these blocks."""
        with self._lock:
            mine = self._blocks.get(replica)
            for h in block_hashes:
                holders = self._holders.get(h)
                if holders is not None:
                    holders.discard(replica)
                    if not holders:
                        del self._holders[h]
                if mine is not None:
                    mine.discard(h)
                self._expected.pop((h, replica), None)

    def cleared(self, replica: R) -> None:
        """``AllBlocksCleared`` (or the replica is gone): forget its blocks."""
        with self._lock:
            self._expected = {k: t for k, t in self._expected.items() if k[1] != replica}
            for h in self._blocks.pop(replica, set()):
                holders = self._holders.get(h)
                if holders is not None:
                    holders.discard(replica)
                    if not holders:
                        del self._holders[h]

    def num_blocks(self, replica: R) -> int:
        """Blocks ``replica`` is known to cache."""
        with self._lock:
            return len(self._blocks.get(replica, ()))

    def matched_blocks(self, block_hashes: Sequence[bytes], replicas: Iterable[R]) -> dict[R, int]:
        """For each of ``replicas``, how many leading blocks of ``block_hashes``
        (a request's chained hashes, in order) it holds."""
        matched = dict.fromkeys(replicas, 0)
        alive = set(matched)
        now = self._clock()
        with self._lock:
            for i, h in enumerate(block_hashes):
                holders = self._holders.get(h, set())
                alive = {r for r in alive if r in holders or self._expected.get((h, r), 0.0) > now}
                if not alive:
                    break
                for r in alive:
                    matched[r] = i + 1
        return matched


def choose_replica(
    queue_lens: Mapping[R, int],
    matched_blocks: Mapping[R, int],
    num_blocks: int,
    config: RoutingConfig = RoutingConfig(),
    rng: random.Random | None = None,
) -> RoutingDecision[R]:
    """The module's rule: load imbalance, else the longest cached prefix, else
    power of two choices.

    Args:
        queue_lens: each candidate replica's requests in flight.
        matched_blocks: each candidate's cached leading blocks of the request
            (missing: 0).
        num_blocks: the request's full blocks.
        config: the thresholds.
        rng: random source of power of two choices (default: ``random``).
    Raises:
        ValueError: no candidate.
    """
    if not queue_lens:
        raise ValueError("no replica to route to")
    replicas = list(queue_lens)
    least = min(replicas, key=lambda r: queue_lens[r])
    lo, hi = queue_lens[least], max(queue_lens.values())
    if hi - lo > config.balance_abs_threshold and hi > config.balance_rel_threshold * lo:
        return RoutingDecision(least, "imbalanced", matched_blocks.get(least, 0))
    if num_blocks > 0:
        best = max(replicas, key=lambda r: (matched_blocks.get(r, 0), -queue_lens[r]))
        matched = matched_blocks.get(best, 0)
        if matched > 0 and matched / num_blocks >= config.match_threshold:
            return RoutingDecision(best, "prefix", matched)
    pick = (rng or random).sample(replicas, min(2, len(replicas)))
    chosen = min(pick, key=lambda r: queue_lens[r])
    return RoutingDecision(chosen, "power_of_two", matched_blocks.get(chosen, 0))
