"""Fitting this machine's CPU profile: a short run of the real engine over
step shapes from one sequence to a full batch, from decode to long prefill
chunks, and short prompts arriving among running decodes (the shapes live
traffic has); each ``LLMEngine.step()`` (schedule, forward, sampling,
scheduler update and output processing with detokenization) is timed with
the batch its scheduler produced, and the step-time model's coefficients
(``combine`` "sum": fixed overhead, the two-or-more-token term, per
sequence, per projection FLOP, per attention FLOP, per KV byte) are fitted
by least squares on relative error (coefficients kept non-negative) at
each matmul knee of 0, 2-64 rows (``matmul_knee_tokens``: the projections
of a step of fewer rows cost as many), keeping the knee of the least
error, then
each of 2-8 tokens a step its own median residual (``few_token_s``), on two
thirds of the runs; the error on the held-back third is reported in the
profile's ``fit``, with the conditions of the run (torch threads, CPUs the
process may run on, load average, process CPU time over wall time).

The runs are measured ``repeats`` times over (the same requests, so the same
batches step by step) and each step's time is the mean over the passes
(``statistic="mean"``, the default: the expected step time, interruptions
by the machine's other work included at the rate they happen, which is what
a run's throughput and latencies add up), or the median (``"median"``: the
undisturbed step, a step slowed by another process in one pass left out).
Each pass's step times are kept in the profile's ``fit.pass_seconds``, and
its summed time against the median pass in the conditions
(``pass_time_rel``): the machine's own speed variation during the
calibration.

Measure under the conditions the profile is meant for: the engine's steps
are timed by the wall clock, so a process sharing its cores with others is
fitted slower than the machine is (``fit.conditions.cpu_over_wall`` below 1
says so).

The profile's peak figures are stated, not fitted: FP32 FLOP/s = torch
threads x clock x FLOP/cycle (2 FMA pipes: 32 with AVX2, 64 with AVX-512),
memory bandwidth = a numpy copy of 256 MiB measured at calibration; the
fitted coefficients are expressed as efficiencies against them.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from . import cpu_info
from .hardware import PROFILE_DIR, HardwareProfile
from .models import ModelShape, resolve_model_shape
from .step_time import WEIGHT_BYTES, StepShape, StepTimeModel

__all__ = [
    "CalibrationPoint",
    "fit_profile",
    "measure_steps",
    "combine_passes",
    "run_calibration",
]

#: (sequences, prompt tokens, output tokens[, every]) of each calibration
#: run: its requests all added at once, or with ``every`` one request added
#: each ``every`` steps, so its short prompts are scheduled beside the
#: earlier requests' decodes, as live traffic's are. Every run
#: ``k % 3 == 2`` is held back. The runs cover one sequence to a full batch
#: of 64, prefill chunks from 16 to 2048 tokens, short prompts (16-128
#: tokens) among 1-23 decodes, and decodes of 9-64 sequences at contexts of
#: 40-300 tokens.
RUNS: tuple[tuple[int, ...], ...] = (
    (1, 32, 16),
    (2, 256, 8),
    (12, 32, 24, 1),
    (4, 384, 6),
    (16, 64, 20, 1),
    (8, 128, 8),
    (10, 16, 16, 1),
    (24, 200, 8),
    (3, 64, 8),
    (6, 128, 8),
    (24, 48, 20, 1),
    (16, 24, 24, 2),
    (48, 96, 8),
    (5, 64, 8),
    (64, 32, 6),
    (12, 96, 16, 1),
    (32, 160, 8),
    (20, 32, 28, 1),
    (16, 256, 10),
    (8, 128, 16, 3),
    (1, 768, 8),
    (2, 64, 8),
    (6, 512, 4),
)

CalibrationPoint = tuple[int, StepShape, float]  # (run, shape, seconds)

#: How each step's time is taken over the passes (``combine_passes``).
STATISTICS = ("mean", "median")


class RecordingScheduler:
    """Forwards to the engine's scheduler, keeping the last ``schedule()``."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.last: Any = None

    def schedule(self) -> Any:
        self.last = self._inner.schedule()
        return self.last

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def measure_steps(
    engine: Any, runs: Sequence[tuple[int, ...]] = RUNS, seed: int = 0, log: bool = False
) -> list[CalibrationPoint]:
    """Time every step of each run on an ``LLMEngine`` (its requests all
    added then stepped to the end, or with ``every``, one request added
    before every ``every``-th step); returns (run index, shape, seconds).

    Raises:
        ValueError: a run that is not (sequences, prompt, output[, every])
            of positive counts, naming it.
    """
    from .. import SamplingParams

    fields = [_run_fields(r) for r in runs]  # every run checked before any is measured
    core = engine.engine_core
    rec = RecordingScheduler(core.scheduler)
    core.scheduler = rec
    rng = np.random.default_rng(seed)
    points: list[CalibrationPoint] = []
    try:
        for k, (n, plen, out, every) in enumerate(fields):
            params = SamplingParams(temperature=0.0, max_tokens=out, ignore_eos=True)
            prompts = [rng.integers(100, 30000, size=plen).tolist() for _ in range(n)]
            added, step = 0, 0
            while added < n or engine.has_unfinished_requests():
                while added < n and (every == 0 or step >= added * every):
                    engine.add_request(
                        f"cal{k}-{added}", prompts[added], params, cache_salt=f"cal{k}-{added}"
                    )
                    added += 1
                step += 1
                t = time.perf_counter()
                engine.step()
                dt = time.perf_counter() - t
                if rec.last is not None and rec.last.batch.num_tokens:
                    points.append((k, StepShape.from_batch(rec.last.batch), dt))
            if log:
                how = f", one every {every} steps" if every else ""
                print(
                    f"calibration run {k + 1}/{len(runs)}: {n} x ({plen} + {out}) tokens{how}",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        core.scheduler = rec._inner
    return points


def _run_fields(run: Sequence[int]) -> tuple[int, int, int, int]:
    """(sequences, prompt, output, every) of a run; ``every`` 0: all at once."""
    ok = len(run) in (3, 4) and all(isinstance(v, int) and v >= 1 for v in run)
    if not ok:
        raise ValueError(
            f"calibration run {tuple(run)!r}: (sequences, prompt tokens, output tokens"
            "[, every]) of positive integers"
        )
    n, plen, out = run[:3]
    return n, plen, out, run[3] if len(run) == 4 else 0


def combine_passes(
    passes: Sequence[Sequence[CalibrationPoint]], statistic: str = "mean"
) -> list[CalibrationPoint]:
    """Per step, the mean (or median) time over passes of the same runs.

    Args:
        passes: ``measure_steps`` results of the same runs and seed, each a
            list of (run, shape, seconds) in step order.
        statistic: "mean" or "median".
    Returns:
        (run, shape, seconds) per step.
    Raises:
        ValueError: no passes, an unknown statistic, or passes whose steps
            differ (count, run or batch shape), naming the first differing step.
    """
    if statistic not in STATISTICS:
        raise ValueError(f"calibration: statistic must be one of {STATISTICS}, got {statistic!r}")
    if not passes:
        raise ValueError("calibration: no passes to combine")
    first = passes[0]
    for j, other in enumerate(passes[1:], start=2):
        if len(other) != len(first):
            raise ValueError(
                f"calibration: pass {j} has {len(other)} steps, pass 1 has {len(first)}"
            )
        for i, (a, b) in enumerate(zip(first, other, strict=True)):
            if a[0] != b[0] or a[1] != b[1]:
                raise ValueError(
                    f"calibration: step {i} of pass {j} is run {b[0]} {b[1]}, "
                    f"pass 1 has run {a[0]} {a[1]}"
                )
    times = np.asarray([[p[2] for p in ps] for ps in passes])
    per_step = np.mean(times, axis=0) if statistic == "mean" else np.median(times, axis=0)
    return [(k, s, float(t)) for (k, s, _), t in zip(first, per_step, strict=True)]


def _nnls_weighted(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares of relative error with non-negative coefficients (an
    active set: drop the most negative coefficient and refit)."""
    w = 1.0 / y
    active = list(range(x.shape[1]))
    scale = np.abs(x).max(axis=0)
    scale[scale == 0] = 1.0
    while True:
        xs = (x[:, active] / scale[active]) * w[:, None]
        coef_s, *_ = np.linalg.lstsq(xs, y * w, rcond=None)
        coef = coef_s / scale[active]
        if (coef >= 0).all() or len(active) == 1:
            full = np.zeros(x.shape[1])
            full[active] = np.maximum(coef, 0)
            return full
        active.pop(int(np.argmin(coef)))


def _errors(pred: np.ndarray, y: np.ndarray) -> dict[str, float]:
    rel = np.abs(pred - y) / y
    return {
        "num_points": len(y),
        "mean_abs_rel": float(rel.mean()),
        "median_abs_rel": float(np.median(rel)),
        "p90_abs_rel": float(np.percentile(rel, 90)),
        "max_abs_rel": float(rel.max()),
        "total_time_rel": float(abs(pred.sum() - y.sum()) / y.sum()),
    }


#: The knees the fit tries, in rows: none, then 2 to 64.
KNEES: tuple[int, ...] = (0, *range(2, 65))


def _fit_at_knee(
    model: ModelShape,
    base: HardwareProfile,
    knee: float,
    shapes: Sequence[StepShape],
    y: np.ndarray,
    fitted: np.ndarray,
    dtype: str,
    weight_dtype: str | None,
) -> tuple[np.ndarray, float]:
    """The coefficients fitted on the ``fitted`` points with the projections
    timed at ``knee`` rows, and their summed squared relative residual."""
    prof = HardwareProfile(**{**base.__dict__, "combine": "sum", "matmul_knee_tokens": knee})
    sm = StepTimeModel(model, prof, dtype=dtype, weight_dtype=weight_dtype)
    x = np.asarray([sm.features(s) for s in shapes])
    c = _nnls_weighted(x[fitted], y[fitted])
    r = (x[fitted] @ c - y[fitted]) / y[fitted]
    return c, float(r @ r)


def fit_profile(
    points: Sequence[CalibrationPoint],
    model: ModelShape,
    base: HardwareProfile,
    *,
    holdout_every: int = 3,
    dtype: str = "float32",
    weight_dtype: str | None = None,
    knees: Sequence[float] = KNEES,
) -> HardwareProfile:
    """Fit ``base``'s overhead, per-sequence time, efficiencies and matmul
    knee to the measured ``points`` (runs ``k % holdout_every ==
    holdout_every - 1`` held back), with ``combine`` "sum".

    For each knee of ``knees`` the six coefficients (constant, two-or-more
    tokens, per sequence, per projection FLOP at the knee, per attention
    FLOP, per KV byte) are fitted by non-negative least squares of relative
    error; the knee whose fit leaves the least squared relative error on the
    fitted runs is kept (the held-back runs choose nothing), if it beats no
    knee (0, when ``knees`` has it) by more than the Bayesian information
    criterion's price of one parameter (a factor ``exp(ln(n) / n)`` of the
    squared error over ``n`` fitted points). Then each step
    size of 2-8 tokens gets its median residual on the fitted runs
    (``few_token_s``, at least 3 steps of that size).

    Returns:
        the fitted profile; its ``fit`` holds the coefficients, the knee,
        the points (run, shape fields, seconds) and the error on the fitted
        and the held-back points.
    Raises:
        ValueError: too few points to fit six coefficients, or no knee given.
    """
    if not knees:
        raise ValueError("calibration: no matmul knee to try")
    runs = np.asarray([p[0] for p in points])
    shapes = [p[1] for p in points]
    y = np.asarray([p[2] for p in points])
    held = runs % holdout_every == holdout_every - 1
    if (~held).sum() < 12:
        raise ValueError(f"calibration: {int((~held).sum())} points to fit, need at least 12")
    tried = [
        (k, *_fit_at_knee(model, base, k, shapes, y, ~held, dtype, weight_dtype)) for k in knees
    ]
    knee, c, best = min(tried, key=lambda t: t[2])
    # a knee is one more fitted parameter: kept only where it lowers the
    # squared error by more than the Bayesian information criterion's price
    # of one parameter over n points, a factor exp(ln(n) / n)
    n_fit = int((~held).sum())
    none = [t for t in tried if t[0] == 0]
    if none and none[0][2] <= best * math.exp(math.log(n_fit) / n_fit):
        knee, c, best = none[0]
    peak = base.flops(dtype)
    bw = base.memory_bandwidth_Bps
    lin_bytes = (model.linear_params + model.lm_head_params) * WEIGHT_BYTES[weight_dtype or dtype]
    overhead = float(c[0] - lin_bytes * c[5])
    if overhead < 0:  # the weights' read time cannot exceed the constant: cap it
        c[5] = c[0] / lin_bytes
        overhead = 0.0

    def eff(coef: float, rate: float) -> float | None:
        return None if coef <= 0 else float(1.0 / (coef * rate))

    fitted = HardwareProfile(
        **{
            **base.__dict__,
            "combine": "sum",
            "overhead_s": overhead,
            "multi_token_s": float(c[1]),
            "per_seq_s": float(c[2]),
            "matmul_knee_tokens": float(knee),
            "few_token_s": {},
            "efficiency": {
                "matmul": eff(c[3], peak),
                "attention": eff(c[4], peak),
                "memory": eff(c[5], bw),
                "interconnect": base.efficiency.get("interconnect"),
            },
        }
    )
    # the few token counts apart: the median residual of the fitted runs'
    # steps of exactly n tokens (at least 3 of them)
    first = StepTimeModel(model, fitted, dtype=dtype, weight_dtype=weight_dtype)
    resid = y - np.asarray([first(s) for s in shapes])
    tokens = np.asarray([s.num_tokens for s in shapes])
    few = {}
    for n in range(2, 9):
        sel = ~held & (tokens == n)
        if sel.sum() >= 3:
            few[str(n)] = float(np.median(resid[sel]))
    fitted = HardwareProfile(**{**fitted.__dict__, "few_token_s": few})
    check = StepTimeModel(model, fitted, dtype=dtype, weight_dtype=weight_dtype)
    pred = np.asarray([check(s) for s in shapes])
    fit = {
        "model": model.name,
        "dtype": dtype,
        "weight_dtype": weight_dtype or dtype,
        "coefficients": {
            "constant_s": float(c[0]),
            "multi_token_s": float(c[1]),
            "per_seq_s": float(c[2]),
            "per_linear_flop_s": float(c[3]),
            "per_attention_flop_s": float(c[4]),
            "per_kv_byte_s": float(c[5]),
            "matmul_knee_tokens": float(knee),
            "few_token_s": few,
        },
        "knee_sq_rel_error": {str(k): e for k, _, e in tried},
        "fitted_error": _errors(pred[~held], y[~held]),
        "heldout_error": _errors(pred[held], y[held]),
        "heldout_runs": sorted({int(r) for r in runs[held]}),
        "points": [[int(k), *_shape_fields(s), float(t)] for k, s, t in points],
    }
    return HardwareProfile(**{**fitted.__dict__, "fit": fit})


def _shape_fields(s: StepShape) -> list[int]:
    return [
        s.num_tokens,
        s.num_seqs,
        s.num_sampled,
        s.num_prefill_tokens,
        s.attn_pairs,
        s.kv_read_tokens,
    ]


def points_from_fit(fit: dict[str, Any]) -> list[CalibrationPoint]:
    """The calibration points stored in a profile's ``fit``."""
    return [(int(p[0]), StepShape(*(int(v) for v in p[1:7])), float(p[7])) for p in fit["points"]]


def run_calibration(
    model: str | None = None,
    out: str | Path | None = None,
    threads: int | None = None,
    runs: Sequence[tuple[int, ...]] = RUNS,
    repeats: int = 3,
    statistic: str = "mean",
) -> HardwareProfile:
    """Calibrate on this machine: build an ``LLMEngine`` (float32 on CPU, 4096
    KV blocks, prefix caching off), warm it up, measure ``runs`` ``repeats``
    times, fit each step's mean (or median) time over the passes, write the
    profile (default: the packaged ``cpu.json``).

    Args:
        model: engine model (default: the packaged default model).
        out: profile file to write.
        threads: torch threads (default: torch's).
        runs: (sequences, prompt tokens, output tokens[, every]) of each run
            (``measure_steps``).
        repeats: passes over ``runs`` (at least 1).
        statistic: each step's time over the passes, "mean" or "median"
            (``combine_passes``).
    Returns:
        the fitted profile.
    Raises:
        ValueError: ``repeats`` below 1, or an unknown statistic.
    """
    if repeats < 1:
        raise ValueError(f"calibration: repeats must be at least 1, got {repeats}")
    if statistic not in STATISTICS:
        raise ValueError(f"calibration: statistic must be one of {STATISTICS}, got {statistic!r}")
    import torch

    from ..engine.arg_utils import EngineArgs
    from ..engine.llm_engine import LLMEngine
    from ..executor.model_registry import DEFAULT_MODEL

    if threads:
        torch.set_num_threads(threads)
    name = model or DEFAULT_MODEL
    args = EngineArgs(
        model=name, dtype="float32", num_gpu_blocks_override=4096, enable_prefix_caching=False
    )
    engine = LLMEngine(args)
    load0 = os.getloadavg()[0]
    try:
        measure_steps(engine, [(4, 64, 8)], seed=1)  # warm-up, discarded
        wall0, cpu0 = time.perf_counter(), time.process_time()
        passes, pass_cpu_over_wall = [], []
        for j in range(repeats):
            w, c = time.perf_counter(), time.process_time()
            passes.append(measure_steps(engine, runs, log=True))
            pass_cpu_over_wall.append((time.process_time() - c) / (time.perf_counter() - w))
            print(f"calibration pass {j + 1}/{repeats} done", file=sys.stderr, flush=True)
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    finally:
        engine.shutdown()
    nthreads = torch.get_num_threads()
    affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    ghz, per_cycle = cpu_info.cpu_ghz(), cpu_info.flops_per_cycle()
    base = HardwareProfile(
        name="cpu",
        source=(
            f"{cpu_info.cpu_name()} ({cpu_info.cpu_isa()}), {os.cpu_count()} logical CPUs, "
            f"torch threads {nthreads}: "
            f"fitted by `pagedrs plan --calibrate` on {name} (float32); peak FP32 = threads x "
            f"{ghz:.2f} GHz x {per_cycle} FLOP/cycle (stated), bandwidth = numpy copy of "
            "256 MiB (measured)"
        ),
        peak_flops={"float32": nthreads * ghz * 1e9 * per_cycle},
        memory_bandwidth_Bps=cpu_info.copy_bandwidth(),
        memory_bytes=float(4 << 30),
        efficiency={"matmul": 1.0, "attention": 1.0, "memory": 1.0, "interconnect": None},
        overhead_s=0.0,
        memory_utilization=1.0,
        combine="sum",
    )
    points = combine_passes(passes, statistic)
    totals = np.asarray([sum(p[2] for p in ps) for ps in passes])
    prof = fit_profile(points, resolve_model_shape(name), base)
    assert prof.fit is not None
    prof.fit["conditions"] = {
        "torch_threads": nthreads,
        "cpu_affinity": affinity,
        "load_average_before": load0,
        "load_average_after": os.getloadavg()[0],
        "wall_s": wall,
        "cpu_over_wall": cpu / wall if wall else None,
        "repeats": repeats,
        "statistic": statistic,
        "pass_time_rel": [float(t / np.median(totals) - 1) for t in totals],
        "pass_cpu_over_wall": pass_cpu_over_wall,
        "runs": [list(r) for r in runs],
    }
    prof.fit["pass_seconds"] = [[round(p[2], 6) for p in ps] for ps in passes]
    prof.save(out or PROFILE_DIR / "cpu.json")
    return prof
