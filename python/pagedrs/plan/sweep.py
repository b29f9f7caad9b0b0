"""Request-rate sweeps and the latency objective: each configuration at each
rate, and the highest rate at which a configuration meets the objective
(found by bisection between the swept rates, every probe a full simulation).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from .config import PlanConfig
from .hardware import HardwareProfile
from .metrics import summarize
from .models import ModelShape
from .simulator import simulate
from .step_time import StepTimeModel
from .trace import Trace

__all__ = ["SLO", "max_rate", "run_plan", "step_model_for"]


@dataclass(frozen=True)
class SLO:
    """A latency objective; every bound given must hold.

    Attributes:
        tpot_ms: bound on TPOT at ``percentile``, ms.
        ttft_ms: bound on TTFT at ``percentile``, ms.
        norm_latency_ms: bound on the mean normalized latency (the paper's
            metric), ms per output token.
        percentile: 50, 90 or 99.
    """

    tpot_ms: float | None = None
    ttft_ms: float | None = None
    norm_latency_ms: float | None = None
    percentile: int = 90

    def __post_init__(self) -> None:
        if self.percentile not in (50, 90, 99):
            raise ValueError(f"SLO percentile must be 50, 90 or 99, got {self.percentile}")
        for k in ("tpot_ms", "ttft_ms", "norm_latency_ms"):
            v = getattr(self, k)
            if v is not None and not v > 0:
                raise ValueError(f"SLO {k} must be > 0, got {v}")

    @property
    def active(self) -> bool:
        """Whether any bound is set."""
        return any(v is not None for v in (self.tpot_ms, self.ttft_ms, self.norm_latency_ms))

    def meets(self, row: dict[str, Any]) -> bool:
        """Whether a report row meets every bound (unfinished requests fail)."""
        if row["num_unfinished"]:
            return False
        p = f"p{self.percentile}"
        checks = [
            (self.tpot_ms, row["tpot_s"][p]),
            (self.ttft_ms, row["ttft_s"][p]),
            (self.norm_latency_ms, row["normalized_latency_s_per_token"]["mean"]),
        ]
        return all(b is None or (math.isfinite(v) and v * 1e3 <= b) for b, v in checks)

    def as_dict(self) -> dict[str, Any]:
        """Every field by name."""
        return asdict(self)


def step_model_for(
    model: ModelShape, profile: HardwareProfile, config: PlanConfig
) -> StepTimeModel:
    """The step-time model of ``config``'s numerics and tensor-parallel size."""
    return StepTimeModel(
        model,
        profile,
        dtype=config.dtype,
        weight_dtype=config.weight_dtype,
        kv_cache_dtype=config.kv_cache_dtype,
        tp=config.tensor_parallel_size,
    )


def _run(
    trace: Trace, config: PlanConfig, sm: StepTimeModel, rate: float, seed: int
) -> dict[str, Any]:
    res = simulate(trace.with_poisson(rate, seed), config, sm, seed=seed)
    return summarize(res, rate)


def max_rate(
    trace: Trace,
    config: PlanConfig,
    sm: StepTimeModel,
    slo: SLO,
    rows: list[dict[str, Any]],
    *,
    seed: int = 0,
    iterations: int = 7,
    max_doublings: int = 8,
) -> dict[str, Any]:
    """The highest request rate meeting ``slo``: from the swept ``rows``, the
    last passing and the first failing rate (doubling past the sweep when all
    pass), then ``iterations`` bisection steps.

    Returns:
        {"max_rate": req/s (0 when even the lowest swept rate fails), "bracket":
        [pass, fail], "probes": rows of the extra rates simulated}.
    """
    swept = [r for r in rows if r["request_rate"] is not None and math.isfinite(r["request_rate"])]
    ordered = sorted(swept, key=lambda r: r["request_rate"])
    passing = [r["request_rate"] for r in ordered if slo.meets(r)]
    failing = [r["request_rate"] for r in ordered if not slo.meets(r)]
    probes: list[dict[str, Any]] = []
    if not ordered:
        return {"max_rate": math.nan, "bracket": None, "probes": probes}
    lo = max(passing) if passing else 0.0
    above = [f for f in failing if f > lo]
    hi = min(above) if above else math.inf

    def meets(rate: float) -> bool:
        """Simulate ``rate`` (kept in ``probes``): does it meet ``slo``?"""
        row = _run(trace, config, sm, rate, seed)
        probes.append(row)
        return slo.meets(row)

    k = 0
    while not math.isfinite(hi) and k < max_doublings:
        rate = lo * 2
        if meets(rate):
            lo = rate
        else:
            hi = rate
        k += 1
    if not math.isfinite(hi):
        return {"max_rate": lo, "bracket": [lo, None], "probes": probes}
    if lo == 0.0:
        lo_probe = hi / 16
        if not meets(lo_probe):
            return {"max_rate": 0.0, "bracket": [0.0, lo_probe], "probes": probes}
        lo = lo_probe
    for _ in range(iterations):
        mid = (lo + hi) / 2
        if meets(mid):
            lo = mid
        else:
            hi = mid
    return {"max_rate": lo, "bracket": [lo, hi], "probes": probes}


def run_plan(
    trace: Trace,
    configs: list[PlanConfig],
    model: ModelShape,
    profile: HardwareProfile,
    rates: list[float],
    slo: SLO | None = None,
    *,
    seed: int = 0,
    search_iterations: int = 7,
) -> list[dict[str, Any]]:
    """Every configuration at every rate (and its highest rate under ``slo``).

    Returns:
        one dict per configuration: ``label``, ``config``, ``rows`` (one
        :func:`pagedrs.plan.metrics.summarize` row per rate), and with an SLO
        ``max_rate`` and ``bracket``.
    Raises:
        ValueError: as :func:`pagedrs.plan.simulator.simulate`, or a
            configuration the step model refuses.
    """
    out = []
    base = configs[0] if len(configs) == 1 else None
    for cfg in configs:
        sm = step_model_for(model, profile, cfg)
        if trace.timed:
            rows = [summarize(simulate(trace, cfg, sm, seed=seed), None)]
        else:
            rows = [_run(trace, cfg, sm, r, seed) for r in rates]
        entry: dict[str, Any] = {"label": cfg.label(base), "config": cfg.as_dict(), "rows": rows}
        if slo is not None and slo.active and not trace.timed:
            found = max_rate(trace, cfg, sm, slo, rows, seed=seed, iterations=search_iterations)
            entry["max_rate"] = found["max_rate"]
            entry["bracket"] = found["bracket"]
        out.append(entry)
    return out
