"""Batch-invariant float32 projections: the Rust dense kernel
(``pagedrs._core.dense_linear``, ``executor.models.dense``) against torch's
``F.linear`` (MKL), by rows per call, and end to end: decode tokens/s with
``batch_invariant`` on and off.

Kernel: for each shape ``K->N`` (the default model's LM head 576->49152, its
576->1536 and 1536->576 projections, a 1B model's 2048->8192), at each row
count ``M``, the two alternate ``--reps`` times in one process: the best
time of each and their ratio (``speedup``), and the ratio of the medians
(on a shared machine the best times are the least disturbed). On a machine
busy with other jobs, waking a sleeping OpenMP worker can cost milliseconds,
and which call pays depends on which one ran before (torch runs a one-row
``F.linear`` on one thread, the dense kernel runs small calls on one); there
``--threads 1`` compares the kernels themselves. Each call reads one of several
copies of the weight, together larger than the L3 cache, so weights stream
from memory as in a model's step. ``inv`` columns: the share of (up to 8
sampled) rows whose bits equal the same row computed alone.

End to end: ``LLM(dtype="float32")`` with ``batch_invariant`` off and on (two
engines, runs alternated ``--e2e-reps`` times): 1 and 16 Alpaca prompts,
``--max-tokens`` greedy tokens each (EOS ignored), output tokens/s (median).

    python benches/bench_dense_linear.py [--reps 7] [--rows 1,2,4,8,16,64,256] [--json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from common import alpaca_prompts, json_safe, print_table
from pagedrs import LLM, SamplingParams
from pagedrs.executor.models.dense import DenseWeight, dense_isas

SHAPES = [(576, 49152, "LM head"), (576, 1536, "up"), (1536, 576, "down"), (2048, 8192, "1B up")]
#: Total bytes of weight copies a shape cycles through (more than the L3).
STREAM_BYTES = 96 << 20


def cpu_name() -> str:
    """The CPU's model name, its cores and whether it has AVX-512."""
    name = platform.processor() or "unknown CPU"
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and name in ("unknown CPU", "x86_64"):
                    name = line.split(":", 1)[1].strip()
                if line.startswith("flags"):
                    flags = line
                    break
    except OSError:
        pass
    isa = "AVX-512" if " avx512f" in flags else ("AVX2" if " avx2" in flags else "no AVX2")
    return f"{name}, {torch.get_num_threads()} threads, {isa}"


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def invariant_share(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> float:
    """Share of up to 8 sampled rows of ``x`` whose bits in ``fn(x)`` equal ``fn(row)``."""
    full = fn(x)
    picks = torch.linspace(0, x.shape[0] - 1, min(8, x.shape[0])).long().unique()
    same = [torch.equal(fn(x[i : i + 1])[0], full[i]) for i in picks.tolist()]
    return sum(same) / len(same)


def shape_rows(k: int, n: int, label: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The kernel rows of one shape ``K->N``, one per row count."""
    gen = torch.Generator().manual_seed(0)
    copies = max(1, -(-STREAM_BYTES // (4 * n * k)))
    weights = [torch.randn(n, k, generator=gen) for _ in range(copies)]
    dense = [DenseWeight(w) for w in weights]
    rows = []
    for m in args.rows:
        x = torch.randn(m, k, generator=gen)
        ours, theirs = [], []
        for rep in range(args.reps):
            ours.append(timed(partial(dense[rep % copies], x)))
            theirs.append(timed(partial(F.linear, x, weights[(rep + copies // 2) % copies])))
        t_ours, t_torch = min(ours), min(theirs)
        row = {
            "case": f"{label} {k}->{n}, M={m}",
            "shape": f"{k}->{n}",
            "label": label,
            "rows": m,
            "dense_ms": 1e3 * t_ours,
            "f_linear_ms": 1e3 * t_torch,
            "speedup": t_torch / t_ours,
            "speedup_median": statistics.median(theirs) / statistics.median(ours),
            "dense_inv": invariant_share(dense[0], x),
            "f_linear_inv": invariant_share(partial(_f_linear, weight=weights[0]), x),
        }
        rows.append(row)
        print(
            f"{row['shape']:>11} M={m:<4} dense {row['dense_ms']:8.2f} ms  F.linear "
            f"{row['f_linear_ms']:8.2f} ms  x{row['speedup']:.2f}",
            flush=True,
        )
    return rows


def _f_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return F.linear(x, weight)


def e2e_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    common = {"dtype": "float32", "max_model_len": 1024, "kv_cache_memory_bytes": 512 << 20}
    engines = {bi: LLM(batch_invariant=bi, **common) for bi in (False, True)}
    prompts = [[{"role": "user", "content": p}] for p in alpaca_prompts(16)]
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    results: dict[tuple[int, bool], list[float]] = {}
    for _ in range(args.e2e_reps):
        for seqs in args.seqs:
            for bi, llm in engines.items():
                t0 = time.perf_counter()
                outs = llm.chat(prompts[:seqs], params, use_tqdm=False)
                dt = time.perf_counter() - t0
                toks = sum(len(o.outputs[0].token_ids) for o in outs)
                results.setdefault((seqs, bi), []).append(toks / dt)
    rows = []
    for seqs in args.seqs:
        off, on = (statistics.median(results[(seqs, bi)]) for bi in (False, True))
        rows.append({"seqs": seqs, "off_tok_s": off, "on_tok_s": on, "on_over_off": on / off})
    for llm in engines.values():
        llm.llm_engine.shutdown()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--rows", type=lambda s: [int(v) for v in s.split(",")], default=[1, 2, 4, 8, 16, 64, 256]
    )
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--seqs", type=lambda s: [int(v) for v in s.split(",")], default=[1, 16])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--e2e-reps", type=int, default=3)
    ap.add_argument("--no-e2e", action="store_true", help="the kernel table only")
    ap.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: torch's own)"
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    cpu = cpu_name()
    print(f"CPU: {cpu}; dense kernel variants: {dense_isas()}")
    kernel = [r for k, n, label in SHAPES for r in shape_rows(k, n, label, args)]
    print_table(
        f"float32 projections, best ms per call ({cpu})",
        [
            "shape",
            "M",
            "dense ms",
            "F.linear ms",
            "speedup",
            "median ratio",
            "dense inv",
            "F.linear inv",
        ],
        [
            [
                r["shape"],
                r["rows"],
                r["dense_ms"],
                r["f_linear_ms"],
                r["speedup"],
                r["speedup_median"],
                r["dense_inv"],
                r["f_linear_inv"],
            ]
            for r in kernel
        ],
    )
    e2e = [] if args.no_e2e else e2e_rows(args)
    if e2e:
        print_table(
            f"decode, output tokens/s, {args.max_tokens} greedy tokens per sequence ({cpu})",
            ["seqs", "batch_invariant off", "on", "on / off"],
            [[r["seqs"], r["off_tok_s"], r["on_tok_s"], r["on_over_off"]] for r in e2e],
        )
    if args.json:
        print(json.dumps(json_safe({"cpu": cpu, "kernel": kernel, "e2e": e2e, "args": vars(args)})))


if __name__ == "__main__":
    main()
