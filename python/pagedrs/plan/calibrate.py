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

import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from . import cpu_info
from .calibration_fit import STATISTICS, CalibrationPoint, combine_passes, fit_profile
from .hardware import PROFILE_DIR, HardwareProfile
from .models import resolve_model_shape
from .step_time import StepShape

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
    rng = np.random.default_rng(seed)
    points: list[CalibrationPoint] = []
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
            batch = core.last_batch
            if batch is not None and batch.num_tokens:
                points.append((k, StepShape.from_batch(batch), dt))
        if log:
            how = f", one every {every} steps" if every else ""
            print(
                f"calibration run {k + 1}/{len(runs)}: {n} x ({plen} + {out}) tokens{how}",
                file=sys.stderr,
                flush=True,
            )
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
