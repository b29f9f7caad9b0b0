"""Where a CPU step's wall time goes: the native model's pieces timed by
wrapping them (projections by kind, attention, norms, rotary embedding, the
MLP's activation, sampling, the runner and the engine around them), over the
same job as ``bench_quantized.py`` (16-token prompts, 16 output tokens per
sequence, greedy; one long prompt for the prefill), in one process.

Each timer counts its own time less that of the timers inside it, so the
categories add up to the engine steps' time. A decode run's first step
processes every prompt (``prompt step``); the later steps are averaged
(``decode step``). Projections include their Python wrapper, the int8
quantization of their activations and the allocation of their outputs.

    PAGEDRS_DATA=/work/shared/data OMP_NUM_THREADS=1 flock /work/wt/cpu1.lock \\
        taskset -c 1 python benches/step_profile.py --batches 1 16 64 --prefill 2048 \\
        --json benches/results/step_profile_1b_epyc-zen5_2026-12-07.json
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_quantized as bq  # noqa: E402

FILE = Path.home() / ".cache/pagedrs/gguf/llama-1b-random.Q4_0.gguf"

_acc: collections.defaultdict[str, float] = collections.defaultdict(float)
_inner: list[float] = []
_clock = time.perf_counter


def _wrap(owner: Any, name: str, label: str | Callable[[tuple[Any, ...]], str]) -> None:
    """Time ``owner.name`` under ``label`` (its own time, less inner timers)."""
    fn = getattr(owner, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        t = _clock()
        _inner.append(0.0)
        try:
            return fn(*args, **kwargs)
        finally:
            dt = _clock() - t
            inner = _inner.pop()
            _acc[label(args) if callable(label) else label] += dt - inner
            if _inner:
                _inner[-1] += dt

    setattr(owner, name, timed)


def _projection(args: tuple[Any, ...]) -> str:
    """A 1B-shaped Llama's projection by its shape."""
    lin = args[0]
    n, k = lin.out_features, lin.in_features
    if n == 2 * 8192 or n > 65536:
        return "projection: gate/up" if n == 2 * 8192 else "projection: LM head"
    if k == 8192:
        return "projection: down"
    return "projection: o" if n == k else "projection: qkv"


def instrument() -> list[tuple[float, dict[str, float]]]:
    """Wrap the pieces; returns the list each engine step appends its
    ``(seconds, {category: seconds})`` to."""
    from pagedrs.attention.backends import base
    from pagedrs.attention.backends.cpu import CpuBackend
    from pagedrs.attention.metadata import AttentionMetadata
    from pagedrs.engine.core import engine_core
    from pagedrs.executor import model_runner, sampler
    from pagedrs.executor.models import decoder, ops
    from pagedrs.executor.quant.linear import QuantizedLinear

    _wrap(QuantizedLinear, "__call__", _projection)
    _wrap(QuantizedLinear, "add_to", "residual adds")
    _wrap(ops.RMSNorm, "__call__", "RMSNorm")
    _wrap(ops.RotaryTable, "rotate", "rotary embedding")
    _wrap(ops.RotaryTable, "lookup", "rotary embedding")
    _wrap(CpuBackend, "write_kv", "attention: K/V write")
    _wrap(CpuBackend, "decode", "attention: kernel")
    _wrap(base.AttentionBackend, "forward", "attention: Python")
    _wrap(decoder.PagedDecoderModel, "attend", "attention: Python")
    _wrap(decoder.PagedDecoderModel, "layer_forward", "SiLU x up, layer Python")
    if hasattr(decoder, "gate_times_up"):
        _wrap(decoder, "gate_times_up", "SiLU x up, layer Python")
    _wrap(decoder.PagedDecoderModel, "forward", "embedding, layer loop")
    _wrap(decoder.PagedDecoderModel, "compute_logits", "final norm, logits")
    _wrap(sampler.Sampler, "__call__", "sampling")
    _wrap(model_runner.ModelRunner, "execute", "runner, metadata")
    _wrap(AttentionMetadata, "for_groups", "runner, metadata")
    _wrap(engine_core.EngineCore, "step", "engine: scheduler, outputs")
    steps: list[tuple[float, dict[str, float]]] = []
    step = engine_core.EngineCore.step

    def recorded(*args: Any, **kwargs: Any) -> Any:
        before = dict(_acc)
        t = _clock()
        out = step(*args, **kwargs)
        steps.append((_clock() - t, {k: v - before.get(k, 0.0) for k, v in _acc.items()}))
        return out

    engine_core.EngineCore.step = recorded  # type: ignore[method-assign]
    return steps


def _mean(steps: list[tuple[float, dict[str, float]]]) -> dict[str, Any]:
    """Mean milliseconds of the steps, total and per category."""
    n = len(steps)
    cats: collections.Counter[str] = collections.Counter()
    for _, d in steps:
        for k, v in d.items():
            cats[k] += v
    return {
        "steps": n,
        "ms": 1e3 * sum(s for s, _ in steps) / n,
        "categories_ms": {k: 1e3 * v / n for k, v in cats.most_common() if v > 0},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--file", type=Path, default=FILE)
    ap.add_argument("--batches", type=int, nargs="*", default=[1, 16, 64])
    ap.add_argument("--prefill", type=int, default=2048, help="0: none")
    ap.add_argument("--repeat", type=int, default=2, help="runs of each job; the fastest kept")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    import torch
    from pagedrs import LLM, SamplingParams

    steps = instrument()
    job = bq.make_prompts(args.file, max(args.batches, default=1), 16, args.prefill)
    longest = max(args.batches, default=1)
    need = max(longest * 32, args.prefill + 1 + 16)
    llm = LLM(
        model=str(args.file),
        max_model_len=max(args.prefill, 16) + 32,
        max_num_seqs=longest,
        kv_cache_memory_bytes=int(need * 1.1 + 16 * 64) * job["kv_bytes_per_token"],
    )

    def run(prompts: list[list[int]], n_out: int) -> tuple[float, list[tuple[float, Any]]]:
        steps.clear()
        params = SamplingParams(temperature=0.0, max_tokens=n_out, ignore_eos=True)
        t = _clock()
        llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        return _clock() - t, list(steps)

    run(job["short"][:1], 2)  # warm-up
    res: dict[str, Any] = {
        "cpu": bq.cpu_name(),
        "threads": torch.get_num_threads(),
        "file": args.file.name,
        "decode": {},
    }
    for n in args.batches:
        seconds, kept = min(
            (run(job["short"][:n], 16) for _ in range(args.repeat)), key=lambda r: r[0]
        )
        res["decode"][str(n)] = {
            "seconds": seconds,
            "prompt_step": _mean(kept[:1]),
            "decode_step": _mean(kept[1:]),
        }
    if args.prefill:
        runs = []
        for _ in range(args.repeat):
            llm.reset_prefix_cache()  # each run computes the whole prompt
            runs.append(run([job["long"]], 1))
        seconds, kept = min(runs, key=lambda r: r[0])
        res["prefill"] = {"tokens": args.prefill, "seconds": seconds, "step": _mean(kept)}
    for name, row in [(f"{n} seqs", res["decode"][str(n)]) for n in args.batches]:
        for part in ("prompt_step", "decode_step"):
            print(f"{name} {part}: {row[part]['ms']:.2f} ms")
            for k, v in row[part]["categories_ms"].items():
                print(f"    {k:32s} {v:9.2f} ms")
    if args.prefill:
        print(f"prefill {args.prefill}: {res['prefill']['step']['ms']:.1f} ms")
        for k, v in res["prefill"]["step"]["categories_ms"].items():
            print(f"    {k:32s} {v:9.1f} ms")
    if args.json:
        args.json.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
