"""Serving figures of a run (simulated or measured): TTFT, TPOT and
normalized latency at p50/p90/p99, throughput, KV use, batch size,
preemptions, prefix-cache hit rate.

Definitions (the paper's and vLLM's benchmark's): TTFT = first token -
arrival; TPOT = (finish - first token) / (output tokens - 1), for requests of
two or more tokens; normalized latency = (finish - arrival) / output tokens;
throughput over the span from the first arrival to the last finish.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .simulator import SimResult

__all__ = ["PERCENTILES", "latency_summary", "summarize"]

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
