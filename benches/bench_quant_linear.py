"""Projections on quantized weights (``QuantizedLinear``, the Rust kernels of
``rust/pagedrs-kernels/src/quant``) against float32 ``F.linear`` and the bfloat16 ``Linear``
(oneDNN-packed) on the same shape, by rows per call.

Shapes ``N x K`` (outputs x inputs): the default model's (SmolLM2-135M: fused
q/k/v 960 x 576, gate/up 3072 x 576, down 576 x 1536), Llama-3.2-1B's
(2048 x 2048, 8192 x 2048, 2048 x 8192) and one Llama-3.1-8B down projection
(4096 x 14336). Weights are random blocks of each format (the kernels' speed
does not depend on the values). Per (shape, rows) the ways run interleaved,
``--rounds`` times; each figure is the best round's median call time, in
wall time or (``--clock cpu``) in the process's CPU time, the steadier
figure on a shared machine (with ``--threads 1``: no team of threads whose
waiting would count). ``GB/s`` is the weight bytes streamed per second at 1
row (the quantized blocks; float32 for ``F.linear``); ``best float`` is the
faster of float32 ``F.linear`` and the bfloat16 ``Linear``.

    python benches/bench_quant_linear.py [--formats Q4_0,Q4_K,...] [--rows 1,4,16,64,256]
        [--shapes 1b_qkv,...] [--rounds 2] [--threads T] [--clock wall|cpu] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from common import json_safe, print_table
from pagedrs.executor.models.linear import Linear
from pagedrs.executor.quant.linear import QuantizedLinear, quant_isas
from pagedrs.executor.quant.weight import GGUF_BLOCK_TYPES, QuantizedWeight

SHAPES: dict[str, tuple[int, int]] = {
    "135m_qkv": (960, 576),
    "135m_gate_up": (3072, 576),
    "135m_down": (576, 1536),
    "1b_2048x2048": (2048, 2048),
    "1b_8192x2048": (8192, 2048),
    "1b_2048x8192": (2048, 8192),
    "8b_4096x14336": (4096, 14336),
}
FORMATS = [*GGUF_BLOCK_TYPES, "int8"]
F16_FIELDS = {"Q4_1": (0, 2), "Q5_1": (0, 2), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def random_weight(qtype: str, n: int, k: int, rng: np.random.Generator) -> QuantizedWeight:
    """Random ``[n, k]`` blocks of ``qtype`` with small float16 scales."""
    if qtype == "int8":
        data = torch.from_numpy(rng.integers(-127, 128, size=(n, k), dtype=np.int8))
        return QuantizedWeight("int8", (n, k), data, torch.full((n,), 0.01))
    block, size = GGUF_BLOCK_TYPES[qtype]
    raw = rng.integers(0, 256, size=(n, k // block, size), dtype=np.uint8)
    for at in F16_FIELDS.get(qtype, (0,)):
        f16 = rng.uniform(-0.02, 0.02, size=(n, k // block)).astype(np.float16)
        raw[:, :, at : at + 2] = f16.view(np.uint8).reshape(n, k // block, 2)
    return QuantizedWeight(qtype, (n, k), torch.from_numpy(raw.reshape(n, -1)))


def median_time(
    fn: Callable[[], object], clock: Callable[[], float] = time.perf_counter, budget_s: float = 0.3
) -> float:
    """Median seconds of ``fn`` by ``clock`` over at least 3 calls and
    ``budget_s`` of that clock."""
    fn()
    times: list[float] = []
    start = clock()
    while len(times) < 3 or clock() - start < budget_s:
        t0 = clock()
        fn()
        times.append(clock() - t0)
        if len(times) >= 50:
            break
    return statistics.median(times)


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--rows", default="1,4,16,64,256")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    ap.add_argument("--json", action="store_true", help="print one JSON object last")
    args = ap.parse_args()
    formats = args.formats.split(",")
    rows_list = [int(r) for r in args.rows.split(",")]
    rng = np.random.default_rng(0)
    figures = []
    table = []
    torch.set_grad_enabled(False)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    for shape in args.shapes.split(","):
        n, k = SHAPES[shape]
        wf = torch.randn(n, k) * 0.02
        try:
            bf16 = Linear(wf.to(torch.bfloat16))
        except RuntimeError:  # oneDNN cannot pack bfloat16 on this CPU (no AVX-512)
            bf16 = Linear(wf.to(torch.bfloat16), pack=False)
        # k-quants need K a multiple of 256 (not the 135M model's 576).
        fits = [f for f in formats if k % GGUF_BLOCK_TYPES.get(f, (32, 0))[0] == 0]
        quants = {f: QuantizedLinear([random_weight(f, n, k, rng)]) for f in fits}
        for rows in rows_list:
            x = torch.randn(rows, k)
            xb = x.to(torch.bfloat16)
            ways: dict[str, Callable[[], object]] = {
                "f32": lambda x=x, wf=wf: F.linear(x, wf),
                "bf16": lambda xb=xb, bf16=bf16: bf16(xb),
            }
            for f, lin in quants.items():
                ways[f] = lambda lin=lin, x=x: lin(x)
            best = {name: float("inf") for name in ways}
            for _ in range(args.rounds):
                for name, fn in ways.items():
                    best[name] = min(best[name], median_time(fn, clock))
            best_float = min(best["f32"], best["bf16"])
            f32_gbs = 4 * n * k / best["f32"] / 1e9 if rows == 1 else None
            for f in fits:
                t = best[f]
                gbs = quants[f].nbytes / t / 1e9 if rows == 1 else None
                fig = {
                    "shape": shape,
                    "n": n,
                    "k": k,
                    "rows": rows,
                    "format": f,
                    "ms": t * 1e3,
                    "f32_ms": best["f32"] * 1e3,
                    "bf16_ms": best["bf16"] * 1e3,
                    "speedup_vs_f32": best["f32"] / t,
                    "speedup_vs_bf16": best["bf16"] / t,
                    "speedup_vs_best_float": best_float / t,
                    "weight_gb_per_s": gbs,
                    "f32_weight_gb_per_s": f32_gbs,
                }
                figures.append(fig)
                table.append(
                    [
                        shape,
                        rows,
                        f,
                        fig["ms"],
                        fig["f32_ms"],
                        fig["bf16_ms"],
                        fig["speedup_vs_f32"],
                        fig["speedup_vs_bf16"],
                        fig["speedup_vs_best_float"],
                        "" if gbs is None else f"{gbs:.1f}",
                        "" if f32_gbs is None else f"{f32_gbs:.1f}",
                    ]
                )
    header = ["shape", "rows", "format", "ms", "f32 ms", "bf16 ms", "x f32", "x bf16"]
    header += ["x best float", "GB/s", "f32 GB/s"]
    title = (
        f"quantized projections, {cpu_name()}, {torch.get_num_threads()} threads, "
        f"kernel {quant_isas()[0]}, {args.clock} time, load average {os.getloadavg()[0]:.1f}"
    )
    print_table(title, header, table)
    if args.json:
        out = {
            "cpu": cpu_name(),
            "threads": torch.get_num_threads(),
            "isa": quant_isas()[0],
            "clock": args.clock,
            "load_average": os.getloadavg(),
            "figures": figures,
        }
        print(json.dumps(json_safe(out)))


if __name__ == "__main__":
    main()
