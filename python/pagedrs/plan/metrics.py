"""Serving figures of a run (simulated or measured): TTFT, TPOT and
normalized latency at p50/p90/p99, throughput, KV use, batch size,
preemptions, prefix-cache hit rate.

Definitions (the paper's and vLLM's benchmark's): TTFT = first token -
arrival; TPOT = (finish - first token) / (output tokens - 1), for requests of
two or more tokens; normalized latency = (finish - arrival) / output tokens;
throughput over the span from the first arrival to the last finish.

The highest rate at a latency bound read off a sweep (``rate_at_bound``)
comes with its elasticity: the percent change of that rate per percent
change of the latency at the crossing. Where the latency curve is flat at
the bound (a short trace that never reaches a steady queue) the elasticity
is large and a small latency error moves the rate by several times as much.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .simulator import SimResult

__all__ = ["PERCENTILES", "latency_summary", "rate_at_bound", "summarize"]

PERCENTILES = (50, 90, 99)


def _pcts(x: np.ndarray) -> dict[str, float]:
    x = x[np.isfinite(x)]
    if not len(x):
        return {f"p{p}": math.nan for p in PERCENTILES} | {"mean": math.nan}
    d = {f"p{p}": float(np.percentile(x, p)) for p in PERCENTILES}
    d["mean"] = float(x.mean())
    return d


def latency_summary(
    arrival: np.ndarray, first_token: np.ndarray, finish: np.ndarray, output_len: np.ndarray
) -> dict[str, Any]:
    """TTFT, TPOT and normalized latency (each p50/p90/p99/mean, seconds),
    throughput (requests/s, output tokens/s) from per-request times (s) and
    output lengths; unfinished requests (NaN) are counted in ``num_unfinished``."""
    out = output_len.astype(np.float64)
    done = np.isfinite(finish)
    ttft = first_token - arrival
    multi = done & (out > 1)
    tpot = np.full(len(out), math.nan)
    tpot[multi] = (finish[multi] - first_token[multi]) / (out[multi] - 1)
    norm = (finish - arrival) / out
    span = float(np.nanmax(finish) - np.nanmin(arrival)) if done.any() else math.nan
    return {
        "num_requests": int(len(out)),
        "num_unfinished": int((~done).sum()),
        "duration_s": span,
        "throughput_rps": float(done.sum() / span) if span and span > 0 else math.nan,
        "output_tokens_per_s": float(out[done].sum() / span) if span and span > 0 else math.nan,
        "ttft_s": _pcts(ttft),
        "tpot_s": _pcts(tpot),
        "normalized_latency_s_per_token": _pcts(norm),
    }


def summarize(res: SimResult, request_rate: float | None = None) -> dict[str, Any]:
    """The report row of one simulated run."""
    row: dict[str, Any] = {"request_rate": request_rate}
    row |= latency_summary(res.arrival, res.first_token, res.finish, res.output_len)
    row |= {
        "batch_size_mean": res.batch_size_mean,
        "kv_usage_mean": res.kv_usage_mean,
        "kv_utilization_mean": res.kv_utilization_mean,
        "num_preemptions": res.num_preemptions,
        "prefix_hit_rate": (
            res.prefix_cache_hits / res.prefix_cache_queries if res.prefix_cache_queries else 0.0
        ),
        "num_steps": res.num_steps,
        "num_gpu_blocks": res.num_gpu_blocks,
        "routing": res.routing,
        "sim_wall_s": res.wall_s,
    }
    return row


def rate_at_bound(rates: list[float], latencies: list[float], bound: float) -> dict[str, Any]:
    """The highest rate of a sweep whose latency is at most ``bound``: the
    first rate over it ends the search and the crossing is interpolated
    linearly from the rate before it (``bench_throughput``'s reading).

    Args:
        rates: swept request rates, ascending.
        latencies: the latency figure at each rate (same units as ``bound``).
        bound: the latency bound.
    Returns:
        {"rate": req/s, "flag": "" (interpolated), "<" (the lowest rate is
        already over: 0), ">=" (no rate is over: the highest rate),
        "elasticity": d ln(rate) / d ln(latency) along the bracketing
        segment at the crossing (NaN without a crossing)}.
    Raises:
        ValueError: ``rates`` and ``latencies`` of different lengths, or
            rates not ascending.
    """
    if len(rates) != len(latencies):
        raise ValueError(f"{len(rates)} rates but {len(latencies)} latencies")
    if any(b <= a for a, b in zip(rates, rates[1:], strict=False)):
        raise ValueError(f"rates must ascend, got {list(rates)}")
    for j, (r, x) in enumerate(zip(rates, latencies, strict=True)):
        if not x <= bound:
            if j == 0:
                return {"rate": 0.0, "flag": "<", "elasticity": math.nan}
            r0, x0 = rates[j - 1], latencies[j - 1]
            cross = r0 + (r - r0) * (bound - x0) / (x - x0)
            slope = (r - r0) / (x - x0)  # req/s per unit of latency
            return {"rate": cross, "flag": "", "elasticity": slope * bound / cross}
    return {"rate": rates[-1] if rates else math.nan, "flag": ">=", "elasticity": math.nan}
