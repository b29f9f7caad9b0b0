"""The simulator loop: a trace replayed through the engine's own Rust
``Scheduler`` (``pagedrs._core.Scheduler``, the object ``LLMEngine`` steps),
with the step-time model in place of the forward pass.

Each replica does what ``LLMEngine`` does between its steps: requests that have
arrived are added (``add_request`` with ``max_tokens`` = the output length and
no stop token, as ``ignore_eos``), ``schedule()`` picks the batch, the step
model says how long its forward takes, and ``update()`` gets one token per
sampled row; a request's first token and finish are stamped at the end of
the step that produced them. Several replicas run on one event clock, each
request routed on arrival by :mod:`pagedrs.plan.routers` from the replicas'
requests in flight and (for the prefix-cache router) their KV events.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..scheduler_setup import build_scheduler
from .config import PlanConfig
from .routers import Router
from .step_time import StepShape, StepTimeModel
from .trace import Trace

__all__ = ["SimResult", "simulate"]

_FILLER_MOD = 30000
#: Steps between samples of the KV cache use (each weighs the time since the last).
_STATS_EVERY = 4


@dataclass
class SimResult:
    """What one simulated run did (times in s from the trace's start).

    Attributes:
        arrival, first_token, finish: float64 ``[N]`` per request.
        prompt_len, output_len: int64 ``[N]``.
        replica: int64 ``[N]`` replica that served each request.
        num_steps: steps over all replicas.
        busy_s: summed step time over all replicas.
        batch_size_mean: mean scheduled sequences per step.
        kv_usage_mean: time-weighted mean share of device blocks in use
            (sampled every ``_STATS_EVERY`` steps of a replica).
        kv_utilization_mean: time-weighted mean ``kv_cache_utilization``
            (token states / allocated slots of the blocks in use).
        num_preemptions: over all replicas.
        prefix_cache_queries, prefix_cache_hits: prompt tokens looked up / found.
        routing: router decisions by reason.
        num_gpu_blocks: KV blocks per replica.
        wall_s: seconds the simulation took.
    """

    arrival: np.ndarray
    first_token: np.ndarray
    finish: np.ndarray
    prompt_len: np.ndarray
    output_len: np.ndarray
    replica: np.ndarray
    num_steps: int = 0
    busy_s: float = 0.0
    batch_size_mean: float = 0.0
    kv_usage_mean: float = 0.0
    kv_utilization_mean: float = 0.0
    num_preemptions: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    routing: dict[str, int] = field(default_factory=dict)
    num_gpu_blocks: int = 0
    wall_s: float = 0.0
    steps: list[tuple[Any, ...]] | None = None


class _Replica:
    """One engine: a scheduler, its clock and the requests it holds."""

    def __init__(
        self,
        index: int,
        config: PlanConfig,
        num_blocks: int,
        max_model_len: int,
        events: bool,
        step_model: StepTimeModel,
    ) -> None:
        self.index = index
        self.sched = build_scheduler(
            config,
            num_blocks,
            max_model_len,
            num_cpu_blocks=config.num_cpu_blocks,
            enable_kv_cache_events=events,
        )
        self.num_blocks = num_blocks
        self.model = step_model
        self.pending: list[int] = []
        self.inflight = 0
        self.out: Any = None
        self.step_start = 0.0
        self.step_end = 0.0
        # time-weighted sums
        self.num_steps = 0
        self.busy = 0.0
        self.batch_sum = 0.0
        self.kv_usage_sum = 0.0
        self.kv_util_sum = 0.0
        self.since_sample = 0.0
        self.sampled = 0.0


def simulate(
    trace: Trace,
    config: PlanConfig,
    step_model: StepTimeModel,
    *,
    max_model_len: int | None = None,
    seed: int = 0,
    record_steps: bool = False,
    warm_prompts: list[np.ndarray] | None = None,
) -> SimResult:
    """Replay ``trace`` (arrival times set) on ``config``'s replicas.

    Args:
        trace: requests with ``arrival_s`` (see :meth:`Trace.with_poisson`).
        config: scheduler settings and deployment.
        step_model: step times (and, without ``config.num_gpu_blocks``, the
            KV cache size).
        max_model_len: longest sequence (default ``config.max_model_len``,
            else the model's positions).
        seed: random source of the router.
        record_steps: keep each step's (replica, start, seconds, StepShape,
            sequence ids, query lengths, context lengths) in ``SimResult.steps``.
        warm_prompts: prompts every replica has already computed (one token
            each generated) before the trace starts, so its prefix cache holds
            them as a server's does that served them: not timed and not
            counted in the result.
    Raises:
        ValueError: a request the scheduler refuses (named by its index and
            the scheduler's reason), or one that can never be scheduled.
    """
    wall0 = time.perf_counter()
    mlen = max_model_len or config.max_model_len or step_model.model.max_position_embeddings
    blocks = config.num_gpu_blocks or step_model.num_blocks(config.block_size)
    reqs = trace.requests
    n = len(reqs)
    now = 0.0
    router = Router(config.router, config.data_parallel_size, config.block_size, lambda: now, seed)
    events = router.wants_events and config.data_parallel_size > 1
    replicas = [
        _Replica(i, config, blocks, mlen, events, step_model)
        for i in range(config.data_parallel_size)
    ]
    arrival = np.full(n, math.nan)
    first = np.full(n, math.nan)
    finish = np.full(n, math.nan)
    where = np.full(n, -1, dtype=np.int64)
    followers: dict[int, list[int]] = {}
    arrivals: list[tuple[float, int]] = []
    for i, r in enumerate(reqs):
        if r.follows is None:
            arrivals.append((r.arrival_s, i))
        else:
            if not 0 <= r.follows < i:
                raise ValueError(f"request {i}: follows={r.follows} is not an earlier request")
            followers.setdefault(r.follows, []).append(i)
    heapq.heapify(arrivals)
    for rep in replicas:
        _warm(rep.sched, warm_prompts or [], n)
    base = [
        (s.num_preemptions, s.prefix_cache_queries, s.prefix_cache_hits)
        for s in (rep.sched.stats() for rep in replicas)
    ]
    known = np.asarray([r.output_ids is not None for r in reqs], dtype=bool)
    has_ids = known if known.any() else None
    running: list[tuple[float, int]] = []
    steps: list[tuple[Any, ...]] | None = [] if record_steps else None

    def start(rep: _Replica, t: float) -> None:
        for i in rep.pending:
            r = reqs[i]
            try:
                rep.sched.add_request(
                    i, r.prompt, r.output_len, [], expected_output_len=r.output_len
                )
            except ValueError as e:
                raise ValueError(
                    f"request {i} of trace {trace.name!r} (prompt {len(r.prompt)} tokens, "
                    f"output {r.output_len}): {e}"
                ) from e
        rep.pending.clear()
        out = rep.sched.schedule()
        if events:
            router.apply_events(rep.index, rep.sched.take_kv_events())
        if out is None:
            if rep.sched.has_unfinished_requests():
                raise ValueError(
                    f"replica {rep.index}: requests wait that no step can schedule "
                    f"({blocks} KV blocks of {config.block_size} tokens)"
                )
            return
        batch = out.batch
        shape = StepShape.from_batch(batch)
        dt = step_model(shape) if batch.num_tokens else step_model.profile.overhead_s
        rep.out, rep.step_start, rep.step_end = out, t, t + dt
        rep.num_steps += 1
        rep.busy += dt
        rep.batch_sum += shape.num_seqs * dt
        rep.since_sample += dt
        if rep.num_steps % _STATS_EVERY == 1:  # KV use, sampled (stats() costs ~50 us)
            st = rep.sched.stats()
            rep.kv_usage_sum += st.num_used_blocks / max(1, st.num_total_blocks) * rep.since_sample
            rep.kv_util_sum += st.kv_cache_utilization * rep.since_sample
            rep.sampled += rep.since_sample
            rep.since_sample = 0.0
        if steps is not None:
            steps.append(
                (
                    rep.index,
                    t,
                    dt,
                    shape,
                    batch.seq_request_ids.copy(),
                    np.diff(batch.query_start_loc),
                    batch.seq_lens.copy(),
                )
            )
        heapq.heappush(running, (rep.step_end, rep.index))

    def finish_step(rep: _Replica) -> None:
        nonlocal now
        batch = rep.out.batch
        rep.out = None
        rids = batch.sample_request_ids.astype(np.int64)
        k = batch.num_output_tokens.astype(np.int64)
        tokens = 100 + (rids * 7919 + k) % _FILLER_MOD
        if has_ids is not None:
            for j in np.flatnonzero(has_ids[rids]).tolist():
                ids = reqs[int(rids[j])].output_ids
                if ids is not None and k[j] < len(ids):
                    tokens[j] = ids[k[j]]
        new = rids[k == 0]
        first[new] = np.where(np.isnan(first[new]), now, first[new])
        done = rep.sched.update(tokens) if batch.num_tokens else rep.sched.update(tokens[:0])
        if events:
            router.apply_events(rep.index, rep.sched.take_kv_events())
        for f in done:
            i = int(f.id)
            finish[i] = now
            rep.inflight -= 1
            for j in followers.get(i, ()):
                heapq.heappush(arrivals, (now + reqs[j].think_s, j))

    while arrivals or running:
        ta = arrivals[0][0] if arrivals else math.inf
        ts = running[0][0] if running else math.inf
        if ta <= ts:
            now = ta
            touched = set()
            while arrivals and arrivals[0][0] <= now:
                _, i = heapq.heappop(arrivals)
                arrival[i] = now
                q = [rep.inflight for rep in replicas]
                ri = router.choose(reqs[i].prompt, q)
                replicas[ri].pending.append(i)
                replicas[ri].inflight += 1
                where[i] = ri
                touched.add(ri)
            for ri in sorted(touched):
                if replicas[ri].out is None:
                    start(replicas[ri], now)
        else:
            now, ri = heapq.heappop(running)
            rep = replicas[ri]
            finish_step(rep)
            start(rep, now)

    stats = [rep.sched.stats() for rep in replicas]
    busy = sum(rep.busy for rep in replicas)
    sampled = sum(rep.sampled for rep in replicas)
    routing: Counter[str] = router.decisions
    return SimResult(
        arrival=arrival,
        first_token=first,
        finish=finish,
        prompt_len=np.asarray([len(r.prompt) for r in reqs], dtype=np.int64),
        output_len=np.asarray([r.output_len for r in reqs], dtype=np.int64),
        replica=where,
        num_steps=sum(rep.num_steps for rep in replicas),
        busy_s=busy,
        batch_size_mean=sum(rep.batch_sum for rep in replicas) / busy if busy else 0.0,
        kv_usage_mean=sum(rep.kv_usage_sum for rep in replicas) / sampled if sampled else 0.0,
        kv_utilization_mean=sum(rep.kv_util_sum for rep in replicas) / sampled if sampled else 0.0,
        num_preemptions=sum(s.num_preemptions - b[0] for s, b in zip(stats, base, strict=True)),
        prefix_cache_queries=sum(
            s.prefix_cache_queries - b[1] for s, b in zip(stats, base, strict=True)
        ),
        prefix_cache_hits=sum(s.prefix_cache_hits - b[2] for s, b in zip(stats, base, strict=True)),
        routing=dict(routing),
        num_gpu_blocks=blocks,
        wall_s=time.perf_counter() - wall0,
        steps=steps,
    )


def _warm(sched: Any, prompts: list[np.ndarray], first_id: int) -> None:
    """Compute ``prompts`` on ``sched`` (one at a time, one generated token
    each, request ids from ``first_id``: past the trace's) so that its prefix
    cache holds them; no time passes."""
    for j, p in enumerate(prompts):
        sched.add_request(first_id + j, p, 1, [], expected_output_len=1)
        while sched.has_unfinished_requests():
            out = sched.schedule()
            if out is None:
                raise ValueError(f"warm prompt {j} ({len(p)} tokens) cannot be scheduled")
            n = len(out.batch.sample_request_ids)
            sched.update(np.full(n, 100, dtype=np.int64))
