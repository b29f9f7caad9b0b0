"""The step-time model's formulas and the calibration fit."""

from __future__ import annotations

import numpy as np
import pytest
from pagedrs.plan import StepShape, StepTimeModel, load_profile, resolve_model_shape
from pagedrs.plan.calibrate import _run_fields
from pagedrs.plan.calibration_fit import combine_passes, fit_profile, points_from_fit
from pagedrs.plan.hardware import PROFILE_DIR, HardwareProfile


def test_decode_step_is_weight_bandwidth_bound_by_hand() -> None:
    """Llama-3-8B, one decode token at context 1000 on an H100: every weight and
    the context's KV read once at 0.8 x 3.35 TB/s, plus the stated overhead."""
    m = resolve_model_shape("llama-3-8b")
    p = load_profile("h100")
    sm = StepTimeModel(m, p, dtype="bfloat16")
    s = StepShape.from_lengths([1], [1000], sampled=1)
    weights = (32 * (4096 * 4096 * 2 + 2 * 4096 * 1024 + 3 * 4096 * 14336) + 128256 * 4096) * 2
    kv = 2 * 32 * 8 * 128 * 2 * (1000 + 1)
    bw = 3.35e12 * 0.8
    want = weights / bw + kv / bw + 0.002 + 1e-5
    assert sm(s) == pytest.approx(want, rel=1e-12)
    # fp8 KV halves the KV bytes; int8 adds its 2-byte scale per entry
    fp8 = StepTimeModel(m, p, dtype="bfloat16", kv_cache_dtype="fp8")
    assert fp8.kv_bytes_per_token * 2 == sm.kv_bytes_per_token
    int8 = StepTimeModel(m, p, dtype="bfloat16", kv_cache_dtype="int8")
    assert int8.kv_bytes_per_token == 2 * 32 * 8 * (128 + 2)


def test_prefill_is_compute_bound_and_tp_adds_communication() -> None:
    m = resolve_model_shape("llama-3-8b")
    p = load_profile("h100")
    s = StepShape.from_lengths([2048], [2048], sampled=1)
    assert s.attn_pairs == 2048 * 2049 // 2
    one = StepTimeModel(m, p).terms(s)
    lin_flops = 2 * m.linear_params * 2048 + 2 * m.lm_head_params
    assert one["linear"] == pytest.approx(lin_flops / (989e12 * 0.65))
    two = StepTimeModel(m, p, tp=2).terms(s)
    assert two["linear"] == pytest.approx(one["linear"] / 2)
    act = 2 * 2048 * 4096
    comm = 2 * 32 * (1e-5 + 2 * 1 / 2 * act / (450e9 * 0.7))
    assert two["communication"] == pytest.approx(comm)


def test_kv_capacity_from_memory() -> None:
    m = resolve_model_shape("opt-13b")
    sm = StepTimeModel(m, load_profile("a100-80g"), dtype="float16")
    per_token = 2 * 40 * 40 * 128 * 2
    free = 80e9 * 0.9 - m.num_params * 2 - 2e9
    assert sm.num_blocks(16) == int(free // (per_token * 16))


def test_fit_recovers_a_known_model() -> None:
    """Points made by a known "sum" profile (with 3% noise) are fitted back:
    coefficients within a few percent, held-back error near the noise; one
    run also has three one-token decode steps, which tell the constant from
    the two-or-more-token term."""
    m = resolve_model_shape("smollm2-135m")
    truth = HardwareProfile(
        name="truth",
        source="test",
        peak_flops={"float32": 1e12},
        memory_bandwidth_Bps=50e9,
        memory_bytes=4e9,
        efficiency={"matmul": 0.3, "attention": 0.1, "memory": 0.5, "interconnect": None},
        overhead_s=0.004,
        per_seq_s=2e-4,
        multi_token_s=0.01,
        combine="sum",
    )
    sm = StepTimeModel(m, truth, dtype="float32")
    rng = np.random.default_rng(0)
    rng1 = np.random.default_rng(1)
    points = []
    for run in range(12):
        for _ in range(30):
            n = int(rng.integers(1, 64))
            # contexts of each step up to 100 to 4000 tokens: the KV bytes
            # vary apart from the number of sequences
            longest = int(rng1.choice([100, 800, 4000]))
            q = [
                int(rng.integers(1, 3)) if rng.random() < 0.8 else int(rng.integers(16, 256))
                for _ in range(n)
            ]
            ctx = [qq + int(rng.integers(0, longest)) for qq in q]
            s = StepShape.from_lengths(q, ctx, sampled=n)
            points.append((run, s, sm(s) * (1 + 0.03 * rng.standard_normal())))
        for _ in range(3):
            s = StepShape.from_lengths([1], [1 + int(rng1.integers(0, 800))], sampled=1)
            points.append((run, s, sm(s) * (1 + 0.03 * rng1.standard_normal())))
    base = HardwareProfile(**{**truth.__dict__, "name": "fit"})
    fitted = fit_profile(points, m, base, dtype="float32")
    assert fitted.efficiency["matmul"] == pytest.approx(0.3, rel=0.1)
    assert fitted.efficiency["memory"] == pytest.approx(0.5, rel=0.15)
    assert fitted.per_seq_s == pytest.approx(2e-4, rel=0.5)  # a small term: looser
    assert fitted.matmul_knee_tokens == 0  # none in the truth: none fitted
    assert fitted.multi_token_s == pytest.approx(0.01, rel=0.2)
    # the constant: the overhead and one read of the weights
    constant = 0.004 + (m.linear_params + m.lm_head_params) * 4 / (50e9 * 0.5)
    assert fitted.fit["coefficients"]["constant_s"] == pytest.approx(constant, rel=0.05)
    assert fitted.fit["heldout_error"]["median_abs_rel"] < 0.05


def test_packaged_cpu_fit_heldout_error() -> None:
    """The packaged CPU profile's fit, redone from its stored calibration points
    (measured on this machine by ``pagedrs plan --calibrate`` on one pinned
    core, one torch thread), gives the coefficients and held-back error the
    file states, and the step-time model predicts the held-back runs' steps
    (runs it was not fitted on) within 10% at the median and their summed
    time within 5%. Recorded points only: nothing here is timed."""
    path = PROFILE_DIR / "cpu.json"
    if not path.exists():
        pytest.skip("no packaged cpu.json")
    prof = load_profile("cpu")
    fit = prof.fit
    assert fit is not None
    points = points_from_fit(fit)
    base = HardwareProfile(**{**prof.__dict__, "fit": None})
    again = fit_profile(points, resolve_model_shape(fit["model"]), base, dtype=fit["dtype"])
    assert again.fit is not None
    for k, v in fit["coefficients"].items():
        assert again.fit["coefficients"][k] == pytest.approx(v, rel=1e-6, abs=1e-15)
    held = again.fit["heldout_error"]
    assert held == pytest.approx(fit["heldout_error"])
    assert held["num_points"] >= 20
    # the held-back steps predicted by the packaged profile itself
    model = StepTimeModel(resolve_model_shape(fit["model"]), prof, dtype=fit["dtype"])
    runs = set(fit["heldout_runs"])
    y = np.asarray([t for k, _, t in points if k in runs])
    pred = np.asarray([model(s) for k, s, _ in points if k in runs])
    rel = np.abs(pred - y) / y
    assert len(y) == held["num_points"]
    assert np.median(rel) == pytest.approx(held["median_abs_rel"])
    assert np.median(rel) < 0.10
    assert abs(pred.sum() - y.sum()) / y.sum() < 0.05
    # measured with the core to itself: process CPU time ~ wall time
    assert fit["conditions"]["cpu_over_wall"] > 0.9


def _known_cpu(**kw: float) -> HardwareProfile:
    base = dict(
        name="truth",
        source="test",
        peak_flops={"float32": 1e12},
        memory_bandwidth_Bps=50e9,
        memory_bytes=4e9,
        efficiency={"matmul": 0.3, "attention": 0.1, "memory": 0.5, "interconnect": None},
        overhead_s=0.004,
        per_seq_s=2e-4,
        multi_token_s=0.01,
        combine="sum",
    )
    return HardwareProfile(**{**base, **kw})  # type: ignore[arg-type]


def test_knee_by_hand() -> None:
    """A step of 2+ tokens below the knee costs the knee's rows of projection
    FLOPs; at or past it, its own; a one-token step never the knee's."""
    m = resolve_model_shape("smollm2-135m")
    plain = StepTimeModel(m, _known_cpu(), dtype="float32")
    knee = StepTimeModel(m, _known_cpu(matmul_knee_tokens=12), dtype="float32")
    per_row = 2 * m.linear_params / (1e12 * 0.3)
    for n in (1, 2, 5, 12, 20):
        s = StepShape.from_lengths([1] * n, [100] * n, sampled=n)
        extra = 0.0 if n == 1 or n >= 12 else (12 - n) * per_row
        assert knee(s) - plain(s) == pytest.approx(extra, rel=1e-9, abs=1e-15)
    s = StepShape.from_lengths([4, 1], [4, 60], sampled=2)  # a 4-token prompt beside a decode
    assert knee(s) - plain(s) == pytest.approx(7 * per_row, rel=1e-9)


def test_fit_recovers_a_known_knee() -> None:
    """Points made by a known "sum" profile with a matmul knee of 10 rows
    (3% noise), shaped as calibration runs are (batches, short prompts among
    decodes, decodes of 1-64 sequences), are fitted back: the knee within two
    rows, the efficiencies and per-step terms within a few percent, the
    held-back error near the noise; the same points fitted without a knee
    (``knees=(0,)``) are worse on the steps below it."""
    m = resolve_model_shape("smollm2-135m")
    truth = _known_cpu(matmul_knee_tokens=10)
    sm = StepTimeModel(m, truth, dtype="float32")
    rng = np.random.default_rng(0)
    points = []
    for run in range(15):
        for j in range(40):
            n = int(rng.integers(1, 64 if j % 2 else 24))
            prompts = int(rng.integers(0, 3)) if n > 1 and j % 2 else 0
            q = [int(rng.integers(8, 200)) for _ in range(prompts)] + [1] * (n - prompts)
            ctx = [qq + int(rng.integers(0, int(rng.choice([100, 800, 3000])))) for qq in q]
            s = StepShape.from_lengths(q, ctx, sampled=n)
            points.append((run, s, sm(s) * (1 + 0.03 * rng.standard_normal())))
    base = _known_cpu(name="fit")
    fitted = fit_profile(points, m, base, dtype="float32")
    assert abs(fitted.matmul_knee_tokens - 10) <= 2
    assert fitted.fit is not None and fitted.fit["coefficients"]["matmul_knee_tokens"] == (
        fitted.matmul_knee_tokens
    )
    assert fitted.efficiency["matmul"] == pytest.approx(0.3, rel=0.1)
    assert fitted.efficiency["attention"] == pytest.approx(0.1, rel=0.15)
    assert fitted.multi_token_s == pytest.approx(0.01, rel=0.3)
    assert fitted.fit["heldout_error"]["median_abs_rel"] < 0.04
    flat = fit_profile(points, m, base, dtype="float32", knees=(0,))
    assert flat.matmul_knee_tokens == 0
    assert flat.fit is not None
    assert flat.fit["heldout_error"]["mean_abs_rel"] > fitted.fit["heldout_error"]["mean_abs_rel"]
    with pytest.raises(ValueError, match="no matmul knee"):
        fit_profile(points, m, base, dtype="float32", knees=())


@pytest.mark.parametrize(
    "run", [(4, 32), (4, 32, 8, 1, 2), (0, 32, 8), (4, 32, 8, -1), (4, 3.5, 8)]
)
def test_bad_calibration_run_is_named(run: tuple) -> None:  # type: ignore[type-arg]
    with pytest.raises(ValueError, match=r"calibration run .*positive integers"):
        _run_fields(run)
    assert _run_fields((4, 32, 8)) == (4, 32, 8, 0)
    assert _run_fields((4, 32, 8, 2)) == (4, 32, 8, 2)


def test_few_token_terms_by_hand() -> None:
    """``multi_token_s`` is added to every step of two or more tokens,
    ``few_token_s[n]`` to steps of exactly ``n`` tokens, nothing to a
    one-token step."""
    m = resolve_model_shape("smollm2-135m")
    plain = HardwareProfile(
        name="plain",
        source="test",
        peak_flops={"float32": 1e12},
        memory_bandwidth_Bps=50e9,
        memory_bytes=4e9,
        efficiency={"matmul": 0.3, "attention": 0.1, "memory": 0.5, "interconnect": None},
        overhead_s=0.004,
        combine="sum",
    )
    few = HardwareProfile(
        **{**plain.__dict__, "multi_token_s": 0.02, "few_token_s": {"3": 0.007, "5": -0.001}}
    )
    a = StepTimeModel(m, plain, dtype="float32")
    b = StepTimeModel(m, few, dtype="float32")
    for n, extra in ((1, 0.0), (2, 0.02), (3, 0.027), (4, 0.02), (5, 0.019), (9, 0.02)):
        s = StepShape.from_lengths([1] * n, [100] * n, sampled=n)
        assert b(s) - a(s) == pytest.approx(extra, abs=1e-12)
    s = StepShape.from_lengths([3], [3], sampled=1)  # a 3-token prefill is 3 tokens too
    assert b(s) - a(s) == pytest.approx(0.027, abs=1e-12)


def test_combine_passes() -> None:
    """Each step's time is the mean (default) or the median over passes;
    passes whose steps differ are refused naming the step."""
    a = StepShape.from_lengths([1, 1], [10, 20], sampled=2)
    b = StepShape.from_lengths([5], [5], sampled=1)
    passes = [
        [(0, a, 0.10), (1, b, 0.30)],
        [(0, a, 0.50), (1, b, 0.20)],  # a slowed by another process
        [(0, a, 0.12), (1, b, 0.25)],
    ]
    assert combine_passes(passes, "median") == [(0, a, 0.12), (1, b, 0.25)]
    mean = combine_passes(passes)
    assert [p[:2] for p in mean] == [(0, a), (1, b)]
    assert [p[2] for p in mean] == pytest.approx([0.24, 0.25])
    with pytest.raises(ValueError, match="statistic must be one of"):
        combine_passes(passes, "max")
    with pytest.raises(ValueError, match="step 1 of pass 2"):
        combine_passes([passes[0], [(0, a, 0.1), (1, a, 0.3)]])
    with pytest.raises(ValueError, match="pass 2 has 1 steps"):
        combine_passes([passes[0], passes[1][:1]])
    with pytest.raises(ValueError, match="no passes"):
        combine_passes([])
