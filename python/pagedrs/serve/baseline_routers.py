"""Baseline request routers for comparisons (``benches/bench_routing.py``):
round robin. Ray Serve's own power of two choices is
``ray.serve._private.request_router:PowerOfTwoChoicesRequestRouter``."""

from __future__ import annotations

import itertools

from ray.serve.request_router import FIFOMixin, PendingRequest, RequestRouter, RunningReplica

__all__ = ["RoundRobinRouter"]


class RoundRobinRouter(FIFOMixin, RequestRouter):
    """Each request to the next replica in replica-id order (a full replica
    is skipped for the next ones)."""

    def initialize_state(self, **_: object) -> None:
        self._counter = itertools.count()

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        """The next replica, then the others in order."""
        if not candidate_replicas:
            return []
        ordered = sorted(candidate_replicas, key=lambda r: r.replica_id.unique_id)
        start = next(self._counter) % len(ordered)
        turn = ordered[start:] + ordered[:start]
        return [[r] for r in turn]
