"""The calibration fit: each step's time over the measured passes
(``combine_passes``) and the step-time model's coefficients fitted to the
calibration points (``fit_profile``), as :mod:`~pagedrs.plan.calibrate`
describes; the points are stored in the profile's ``fit``
(``points_from_fit`` reads them back)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .hardware import HardwareProfile
from .models import ModelShape
from .step_time import WEIGHT_BYTES, StepShape, StepTimeModel

__all__ = ["STATISTICS", "CalibrationPoint", "combine_passes", "fit_profile", "points_from_fit"]

CalibrationPoint = tuple[int, StepShape, float]  # (run, shape, seconds)

#: How each step's time is taken over the passes (``combine_passes``).
STATISTICS = ("mean", "median")


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
