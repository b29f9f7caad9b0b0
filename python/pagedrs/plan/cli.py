"""``pagedrs plan``: the command line of the capacity planner.

Every configuration flag takes a comma-separated list; the plan simulates
every combination (``--block-size 8,16,32 --allocation-policy
paged,reserve-oracle`` is six configurations) at every ``--request-rates``
rate, and with an objective (``--slo-tpot-ms``, ``--slo-ttft-ms``,
``--slo-norm-latency-ms``) finds each one's highest rate meeting it.
``--calibrate`` instead fits this machine's CPU profile from a short run of
the real engine.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from typing import Any

from .config import ROUTERS, PlanConfig, expand_configs

__all__ = ["add_plan_args", "run_plan_command"]

_AXES: dict[str, tuple[type, str]] = {
    "block_size": (int, "tokens per KV block"),
    "max_num_seqs": (int, "sequences per step"),
    "max_num_batched_tokens": (int, "token budget per step (default: 2048 with chunked prefill)"),
    "max_model_len": (int, "longest sequence (default: the model's positions)"),
    "enable_chunked_prefill": (bool, "true/false"),
    "enable_prefix_caching": (bool, "true/false"),
    "preemption_mode": (str, "recompute or swap"),
    "num_cpu_blocks": (int, "swap space in blocks"),
    "allocation_policy": (str, "paged, reserve-max, reserve-pow2, reserve-oracle (Orca), static"),
    "kv_cache_dtype": (str, "auto, float32, bfloat16, fp8, fp8_e5m2, int8"),
    "dtype": (str, "compute dtype (a peak_flops key of the profile)"),
    "weight_dtype": (str, "weight format: float32, bfloat16, fp8, int8, q8_0, q4_0, q4_k, int4"),
    "tensor_parallel_size": (int, "devices per replica"),
    "data_parallel_size": (int, "replicas"),
    "router": (str, f"router in front of the replicas: {', '.join(ROUTERS)}"),
    "num_gpu_blocks": (int, "KV blocks per replica (default: from the profile's memory)"),
}


def _parse_list(field: str, kind: type, text: str) -> list[Any]:
    out: list[Any] = []
    for item in text.split(","):
        item = item.strip()
        if kind is bool:
            low = item.lower()
            if low not in ("true", "false", "on", "off", "1", "0"):
                raise ValueError(f"--{field.replace('_', '-')}: {item!r} is not true or false")
            out.append(low in ("true", "on", "1"))
        elif kind is int:
            try:
                out.append(int(item))
            except ValueError:
                raise ValueError(
                    f"--{field.replace('_', '-')}: {item!r} is not an integer"
                ) from None
        else:
            out.append(item)
    return out


def add_plan_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the arguments of ``pagedrs plan``.

    Returns:
        ``p``.
    """
    d = " (default: %(default)s)"
    p.add_argument(
        "--model", default="llama-3-8b", help="preset, folder with config.json, or alias" + d
    )
    p.add_argument(
        "--hardware", default="h100", help="profile (a100-80g, h100, h200, cpu) or JSON file" + d
    )
    t = p.add_argument_group("trace")
    t.add_argument("--trace", default="sharegpt", help="sharegpt, alpaca, chat or a .jsonl" + d)
    t.add_argument("--num-requests", type=int, default=200, help="requests of the trace" + d)
    t.add_argument("--max-prompt-len", type=int, default=1024, help="skip longer prompts" + d)
    t.add_argument("--max-output-len", type=int, default=1024, help="cap outputs" + d)
    t.add_argument("--tokenizer", default=None, help="tokenizer of the data traces")
    t.add_argument("--sessions", type=int, default=64, help="chat: sessions" + d)
    t.add_argument("--turns", type=int, default=4, help="chat: turns per session" + d)
    t.add_argument("--think-s", type=float, default=2.0, help="chat: s before the next turn" + d)
    t.add_argument("--request-rates", default="1,2,4,8", help="Poisson rates, req/s" + d)
    t.add_argument("--seed", type=int, default=0)
    s = p.add_argument_group("latency objective")
    s.add_argument("--slo-tpot-ms", type=float, default=None, help="TPOT bound at the percentile")
    s.add_argument("--slo-ttft-ms", type=float, default=None, help="TTFT bound at the percentile")
    s.add_argument(
        "--slo-norm-latency-ms", type=float, default=None, help="mean normalized latency bound"
    )
    s.add_argument("--slo-percentile", type=int, default=90, choices=(50, 90, 99))
    c = p.add_argument_group("configurations (comma-separated lists: every combination runs)")
    for name, (_, help_) in _AXES.items():
        c.add_argument("--" + name.replace("_", "-"), default=None, help=help_)
    o = p.add_argument_group("output")
    o.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    o.add_argument("--plot", default=None, help="write a PNG of the sweep (needs matplotlib)")
    k = p.add_argument_group("calibration")
    k.add_argument("--calibrate", action="store_true", help="fit this CPU's profile")
    k.add_argument("--calibrate-model", default=None, help="engine model of the calibration")
    k.add_argument("--calibrate-out", default=None, help="profile to write (default: cpu.json)")
    k.add_argument("--calibrate-threads", type=int, default=None, help="torch threads")
    k.add_argument(
        "--calibrate-repeats",
        type=int,
        default=3,
        help="passes over the calibration runs (the same steps each pass)",
    )
    k.add_argument(
        "--calibrate-statistic",
        choices=("mean", "median"),
        default="mean",
        help="each step's time over the passes: mean (expected, interruptions included) "
        "or median (undisturbed)",
    )
    return p


def _configs(ns: argparse.Namespace) -> list[PlanConfig]:
    axes: dict[str, list[Any]] = {}
    base = PlanConfig()
    for name, (kind, _) in _AXES.items():
        raw = getattr(ns, name)
        if raw is not None:
            axes[name] = _parse_list(name, kind, raw)
    if ns.hardware.startswith("cpu") and "dtype" not in axes:
        base = dataclasses.replace(base, dtype="float32")
    return expand_configs(base, axes)


def run_plan_command(ns: argparse.Namespace) -> int:
    """Run ``pagedrs plan`` from parsed arguments; returns the exit status.

    Raises:
        ValueError: bad arguments, trace, profile or configuration, naming
            the flag, line or field.
    """
    from .report import format_tables, plot, to_json

    if ns.calibrate:
        from .calibrate import run_calibration

        prof = run_calibration(
            model=ns.calibrate_model,
            out=ns.calibrate_out,
            threads=ns.calibrate_threads,
            repeats=ns.calibrate_repeats,
            statistic=ns.calibrate_statistic,
        )
        fit = prof.fit or {}
        print(f"wrote profile {prof.name}: held-back error {fit.get('heldout_error', {})}")
        if ns.json:
            print(to_json(prof.as_dict()))
        return 0
    from .hardware import load_profile
    from .models import resolve_model_shape
    from .sweep import SLO, run_plan
    from .trace_sources import load_trace

    rates = _parse_rates(ns.request_rates)
    model = resolve_model_shape(ns.model)
    profile = load_profile(ns.hardware)
    slo = SLO(ns.slo_tpot_ms, ns.slo_ttft_ms, ns.slo_norm_latency_ms, ns.slo_percentile)
    configs = _configs(ns)
    trace = load_trace(
        ns.trace,
        tokenizer=ns.tokenizer,
        num_requests=ns.num_requests if ns.trace != "chat" else None,
        max_prompt_len=ns.max_prompt_len,
        max_output_len=ns.max_output_len,
        sessions=ns.sessions,
        turns=ns.turns,
        think_s=ns.think_s,
    )
    t0 = time.perf_counter()
    results = run_plan(trace, configs, model, profile, rates, slo, seed=ns.seed)
    wall = time.perf_counter() - t0
    st = trace.stats()
    head = (
        f"pagedrs plan: {model.name} on {profile.name}, trace {trace.name} "
        f"({st['num_requests']} requests, mean prompt {st['mean_prompt_len']:.0f}, "
        f"mean output {st['mean_output_len']:.0f} tokens); simulated in {wall:.1f} s\n"
        "times in ms; KV use = blocks in use / blocks; KV util = token states / "
        "allocated slots; hit = prefix-cache hit rate"
    )
    print(format_tables(results, head))
    if ns.plot:
        plot(results, ns.plot, f"{model.name} on {profile.name}, {trace.name}")
        print(f"\nplot: {ns.plot}")
    if ns.json:
        print(
            to_json(
                {
                    "model": model.as_dict(),
                    "hardware": profile.name,
                    "trace": {"name": trace.name, **st},
                    "slo": slo.as_dict(),
                    "results": results,
                    "wall_s": wall,
                }
            )
        )
    return 0


def _parse_rates(text: str) -> list[float]:
    out = []
    for item in text.split(","):
        try:
            r = float(item)
        except ValueError:
            raise ValueError(f"--request-rates: {item!r} is not a number") from None
        if not r > 0:
            raise ValueError(f"--request-rates: {item!r} must be > 0")
        out.append(r)
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m pagedrs.plan.cli``: the same as ``pagedrs plan``."""
    p = add_plan_args(argparse.ArgumentParser(prog="pagedrs plan", description=__doc__))
    try:
        return run_plan_command(p.parse_args(argv))
    except ValueError as e:
        print(f"pagedrs plan: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
