"""Paged decode attention (Triton) on the GPU: achieved memory bandwidth vs the GPU's peak,
and speed vs torch SDPA on contiguous K/V of the same shapes.

Shapes: 8 KV heads, 4x grouped-query attention (32 query heads), head dim 128, block
size 16, bfloat16; every sequence of a batch has the same context length, and its
blocks are scattered over the cache (a shuffled block table), as after a while of
serving. Context lengths 512 .. 32k; the batch shrinks as the context grows so that
each size holds --tokens context tokens in all (65536 by default: 256 MiB of K+V,
well above the 50-60 MB L2 of an H100/H200, so repeated calls stream from HBM):
128 sequences at 512 down to 2 at 32k.

Bytes counted per call (the least traffic the attention needs): the K and V of every
context token once per KV head (S * L * Hkv * D * 2 bytes, twice), plus the query read
and the output written (S * Hq * D * 2 bytes each). Block tables and sequence lengths
are left out (< 0.1%); the 4 query heads that share a KV head re-read its K/V, which
is counted once (those re-reads are expected to hit L2). Achieved GB/s = bytes /
median time per call; the peak comes from --peak-gbps or a table of spec-sheet HBM
bandwidths by device name ('unknown' otherwise). A device-to-device copy is timed too
(bytes read + written), as the bandwidth actually reachable on this GPU.

Timing: CUDA events around a CUDA graph of --reps back-to-back calls (so Python launch
overhead is not timed; plain launches if capture fails), after warm-up; median of
--iters replays. SDPA (``F.scaled_dot_product_attention`` with ``enable_gqa``) runs on
contiguous ``[S, Hkv, L, D]`` K/V and reads the same bytes. The PagedAttention paper
reports its paged kernel 20-26% slower than a contiguous one.

Numerics: at every size the kernel's output (and SDPA's) is checked against
``pagedrs.attention.torch_ops.paged_decode_attention`` computed in float32 from the
same bf16 values: max |out - ref| / max |ref| <= --tol. Exits 1 if a check fails.

Without a CUDA GPU it prints "no CUDA GPU: skipping" and exits 0. --cpu-smoke runs the
same code on the CPU with tiny sizes under the Triton interpreter (TRITON_INTERPRET=1),
wall-clock timed: a test of this script, not a measurement.

    python benches/bench_kernels.py [--peak-gbps GBPS] [--iters 20] [--reps 10] [--json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CONTEXTS = (512, 1024, 2048, 4096, 8192, 16384, 32768)
NUM_KV_HEADS, GQA, HEAD_DIM, BLOCK_SIZE = 8, 4, 128, 16
# --cpu-smoke: tiny sizes, the interpreter is slow.
SMOKE_CONTEXTS, SMOKE_KV_HEADS, SMOKE_HEAD_DIM, SMOKE_TOKENS = (32, 80), 2, 32, 128

# Spec-sheet memory bandwidth in GB/s (1e9 bytes/s). First entry whose substrings all
# occur in the device name (case-insensitive) wins, so more specific names come first.
PEAK_GBPS: list[tuple[tuple[str, ...], float]] = [
    (("GH200",), 4000.0),  # 96 GB HBM3 (the 144 GB HBM3e version: 4900)
    (("H200",), 4800.0),
    (("H100", "NVL"), 3900.0),
    (("H100", "PCIE"), 2000.0),
    (("H100",), 3350.0),  # SXM5
    (("H800", "PCIE"), 2000.0),
    (("H800",), 3350.0),
    (("B200",), 8000.0),
    (("A100", "80GB", "PCIE"), 1935.0),
    (("A100", "80GB"), 2039.0),
    (("A100",), 1555.0),  # 40 GB
    (("A800", "80GB"), 2039.0),
    (("L40S",), 864.0),
    (("L40",), 864.0),
    (("L4",), 300.0),
    (("A10G",), 600.0),
    (("A10",), 600.0),
    (("V100",), 900.0),
    (("T4",), 320.0),
    (("RTX 4090",), 1008.0),
    (("RTX 3090",), 936.0),
]


def peak_for(name: str) -> float | None:
    """Spec-sheet bandwidth (GB/s) of a device by its name, or None when not in the table."""
    upper = name.upper()
    for keys, gbps in PEAK_GBPS:
        if all(k in upper for k in keys):
            return gbps
    return None


def load_ops() -> tuple[Any, Any, str]:
    """(Triton kernels module, torch reference module, where they came from).

    Prefers the installed package; falls back to the repository's own files when
    ``pagedrs`` cannot be imported (e.g. its Rust core is not built for this Python).
    """
    try:
        from pagedrs import kernels
        from pagedrs.attention import torch_ops

        return kernels, torch_ops, "pagedrs"
    except ImportError as exc:
        print(f"note: pagedrs not importable ({exc}); loading kernels, torch_ops.py from {ROOT}")

    def load(name: str, path: Path, package: bool) -> Any:
        spec = importlib.util.spec_from_file_location(
            name, path, submodule_search_locations=[str(path.parent)] if package else None
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module

    kernels = load(
        "_bench_pagedrs_kernels", ROOT / "python" / "pagedrs" / "kernels" / "__init__.py", True
    )
    torch_ops = load(
        "_bench_pagedrs_torch_ops",
        ROOT / "python" / "pagedrs" / "attention" / "torch_ops.py",
        False,
    )
    return kernels, torch_ops, "repository files"


class Timer:
    """Median seconds per call of a function: CUDA events on a GPU, wall clock on a CPU."""

    def __init__(self, torch: Any, device: str, iters: int, reps: int, warmup: int) -> None:
        self.torch, self.cuda = torch, device == "cuda"
        self.iters, self.reps, self.warmup = iters, reps, warmup

    def __call__(self, fn: Any) -> tuple[float, str]:
        """(median seconds per call, how it was launched)."""
        torch = self.torch
        for _ in range(self.warmup):
            fn()
        if not self.cuda:
            times = []
            for _ in range(self.iters):
                t0 = time.perf_counter()
                for _ in range(self.reps):
                    fn()
                times.append((time.perf_counter() - t0) / self.reps)
            return statistics.median(times), "wall clock"

        torch.cuda.synchronize()
        run, mode = self._graph(fn)
        run()
        torch.cuda.synchronize()
        times = []
        for _ in range(self.iters):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3 / self.reps)
        return statistics.median(times), mode

    def _graph(self, fn: Any) -> tuple[Any, str]:
        torch, reps = self.torch, self.reps

        def eager() -> None:
            for _ in range(reps):
                fn()

        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                fn()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                eager()
            return graph.replay, "cuda graph"
        except Exception as exc:  # any capture failure: fall back to plain launches
            torch.cuda.synchronize()
            return eager, f"launches ({type(exc).__name__} in graph capture)"


def make_case(torch: Any, device: str, batch: int, ctx: int, hkv: int, dim: int, seed: int):
    """Query, paged caches with a shuffled block table, and lengths for one size."""
    gen = torch.Generator(device=device).manual_seed(seed)
    nb_seq = -(-ctx // BLOCK_SIZE)
    num_blocks = batch * nb_seq
    shape = (num_blocks, hkv, BLOCK_SIZE, dim)
    kw = {"generator": gen, "device": device, "dtype": torch.bfloat16}
    key_cache, value_cache = torch.randn(*shape, **kw), torch.randn(*shape, **kw)
    query = torch.randn(batch, hkv * GQA, dim, **kw)
    perm = torch.randperm(num_blocks, generator=gen, device=device)
    block_tables = perm.view(batch, nb_seq).to(torch.int32)
    seq_lens = torch.full((batch,), ctx, device=device, dtype=torch.int32)
    return query, key_cache, value_cache, block_tables, seq_lens


def rel_err(out: Any, ref: Any) -> float:
    """max |out - ref| / max |ref| (ref in float32)."""
    return float((out.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def bench_size(torch, F, kernels, torch_ops, timer, device, ctx, batch, hkv, dim) -> dict:
    query, key_cache, value_cache, block_tables, seq_lens = make_case(
        torch, device, batch, ctx, hkv, dim, seed=ctx
    )
    scale = dim**-0.5
    elt = 2  # bf16
    kv_bytes = 2 * batch * ctx * hkv * dim * elt
    qo_bytes = 2 * batch * hkv * GQA * dim * elt
    nbytes = kv_bytes + qo_bytes

    # Reference: float32 from the same bf16 values, through the block table.
    ref = torch_ops.paged_decode_attention(
        query.float(), key_cache.float(), value_cache.float(), block_tables, seq_lens, scale
    )

    def paged():
        return kernels.paged_decode_attention(
            query, key_cache, value_cache, block_tables, seq_lens, scale
        )

    out = paged()
    err_paged = rel_err(out, ref)
    t_paged, mode_paged = timer(paged)

    # Contiguous K/V [S, Hkv, L, D] holding the same values, for SDPA.
    k = torch_ops.gather_kv(key_cache, block_tables, ctx).contiguous()
    v = torch_ops.gather_kv(value_cache, block_tables, ctx).contiguous()
    q4 = query.unsqueeze(2)  # [S, Hq, 1, D]

    def sdpa():
        return F.scaled_dot_product_attention(q4, k, v, scale=scale, enable_gqa=True)

    err_sdpa = rel_err(sdpa().squeeze(2), ref)
    t_sdpa, mode_sdpa = timer(sdpa)
    return {
        "context": ctx,
        "batch": batch,
        "kv_mib": kv_bytes / 2**20,
        "bytes": nbytes,
        "paged_us": t_paged * 1e6,
        "paged_gbps": nbytes / t_paged / 1e9,
        "sdpa_us": t_sdpa * 1e6,
        "sdpa_gbps": nbytes / t_sdpa / 1e9,
        "paged_over_sdpa_time": t_paged / t_sdpa,
        "rel_err_paged": err_paged,
        "rel_err_sdpa": err_sdpa,
        "timing": {"paged": mode_paged, "sdpa": mode_sdpa},
    }


def copy_gbps(torch, timer, device: str, nbytes: int) -> float:
    """Device-to-device copy bandwidth, bytes read + written per second, in GB/s."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    seconds, _ = timer(lambda: dst.copy_(src))
    return 2 * nbytes / seconds / 1e9


def gbps(x: float) -> str:
    return f"{x:.0f}" if x >= 10 else f"{x:.3g}"


def fmt_table(title: str, header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [f"\n{title}", "  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--peak-gbps", type=float, default=None, help="peak memory bandwidth, GB/s")
    ap.add_argument("--contexts", type=int, nargs="+", default=list(CONTEXTS))
    ap.add_argument("--tokens", type=int, default=65536, help="context tokens per size in all")
    ap.add_argument("--max-batch", type=int, default=128)
    ap.add_argument("--min-batch", type=int, default=2)
    ap.add_argument("--iters", type=int, default=20, help="timed repetitions (median)")
    ap.add_argument("--reps", type=int, default=10, help="calls per timed repetition")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--tol", type=float, default=1e-2, help="max |out-ref| / max |ref|")
    ap.add_argument("--json", action="store_true", help="print one JSON object last")
    ap.add_argument(
        "--cpu-smoke",
        action="store_true",
        help="test of this script only: tiny sizes on the CPU, Triton interpreter",
    )
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.cpu_smoke:
        # The interpreter must be chosen before triton is first imported.
        os.environ["TRITON_INTERPRET"] = "1"
    import torch
    import torch.nn.functional as F

    if not args.cpu_smoke and not torch.cuda.is_available():
        print("bench_kernels: no CUDA GPU: skipping")
        if args.json:
            print(json.dumps({"skipped": "no CUDA GPU"}))
        return 0

    kernels, torch_ops, source = load_ops()
    torch.manual_seed(0)
    if args.cpu_smoke:
        device, name, contexts = "cpu", "cpu (Triton interpreter)", list(SMOKE_CONTEXTS)
        hkv, dim, tokens = SMOKE_KV_HEADS, SMOKE_HEAD_DIM, SMOKE_TOKENS
        args.iters, args.reps, args.warmup = min(args.iters, 2), 1, 1
        peak = args.peak_gbps
    else:
        device, name, contexts = "cuda", torch.cuda.get_device_name(), args.contexts
        hkv, dim, tokens = NUM_KV_HEADS, HEAD_DIM, args.tokens
        peak = args.peak_gbps if args.peak_gbps is not None else peak_for(name)
    timer = Timer(torch, device, args.iters, args.reps, args.warmup)

    print(
        f"device: {name}; torch {torch.__version__}; kernels from {source}; peak "
        + (f"{peak:.0f} GB/s" if peak else "unknown")
        + ("" if args.peak_gbps is None or args.cpu_smoke else " (--peak-gbps)"),
        flush=True,
    )
    copy = copy_gbps(torch, timer, device, (256 << 20) if device == "cuda" else (1 << 20))
    print(f"device-to-device copy: {gbps(copy)} GB/s (bytes read + written)", flush=True)

    results = []
    for ctx in contexts:
        batch = max(args.min_batch, min(args.max_batch, tokens // ctx))
        r = bench_size(torch, F, kernels, torch_ops, timer, device, ctx, batch, hkv, dim)
        r["ok"] = r["rel_err_paged"] <= args.tol and r["rel_err_sdpa"] <= args.tol
        r["paged_pct_peak"] = 100 * r["paged_gbps"] / peak if peak else None
        r["sdpa_pct_peak"] = 100 * r["sdpa_gbps"] / peak if peak else None
        results.append(r)
        print(
            f"  context {ctx:>6} x {batch:>3} seqs: paged {r['paged_us']:.1f} us, "
            f"SDPA {r['sdpa_us']:.1f} us, errors {r['rel_err_paged']:.1e} / "
            f"{r['rel_err_sdpa']:.1e} ({r['timing']['paged']})",
            flush=True,
        )
        if device == "cuda":
            torch.cuda.empty_cache()

    def pct(x: float | None) -> str:
        return "unknown" if x is None else f"{x:.1f}%"

    rows = [
        [
            str(r["context"]),
            str(r["batch"]),
            f"{r['kv_mib']:.0f}",
            f"{r['paged_us']:.1f}",
            gbps(r["paged_gbps"]),
            pct(r["paged_pct_peak"]),
            f"{r['sdpa_us']:.1f}",
            gbps(r["sdpa_gbps"]),
            pct(r["sdpa_pct_peak"]),
            f"{r['paged_over_sdpa_time']:.2f}x",
            f"{r['rel_err_paged']:.1e}",
            f"{r['rel_err_sdpa']:.1e}",
            "ok" if r["ok"] else "FAIL",
        ]
        for r in results
    ]
    print(
        fmt_table(
            f"Paged decode attention (Triton) vs torch SDPA on contiguous K/V, {name}: "
            f"Hkv {hkv}, Hq {hkv * GQA}, D {dim}, block {BLOCK_SIZE}, bf16; "
            f"peak {f'{peak:.0f} GB/s' if peak else 'unknown'}, copy {gbps(copy)} GB/s",
            [
                "context",
                "seqs",
                "K+V MiB",
                "paged us",
                "paged GB/s",
                "% peak",
                "SDPA us",
                "SDPA GB/s",
                "% peak",
                "paged/SDPA",
                "err paged",
                "err SDPA",
                "check",
            ],
            rows,
        )
    )
    ratios = [r["paged_over_sdpa_time"] for r in results]
    print(
        f"\npaged kernel time / SDPA time: {min(ratios):.2f}x .. {max(ratios):.2f}x "
        "(PagedAttention paper: paged kernel 1.20-1.26x a contiguous one)"
    )
    print(f"timing: {results[0]['timing']['paged']}, median of {args.iters} x {args.reps} calls")
    all_ok = all(r["ok"] for r in results)
    if not all_ok:
        print(f"NUMERICS FAIL: relative error above --tol {args.tol}")
    if args.json:
        print(
            json.dumps(
                {
                    "device": name,
                    "torch": torch.__version__,
                    "cpu_smoke": args.cpu_smoke,
                    "peak_gbps": peak,
                    "copy_gbps": copy,
                    "shape": {
                        "num_kv_heads": hkv,
                        "num_heads": hkv * GQA,
                        "head_dim": dim,
                        "block_size": BLOCK_SIZE,
                        "dtype": "bfloat16",
                    },
                    "iters": args.iters,
                    "reps": args.reps,
                    "tol": args.tol,
                    "results": results,
                    "all_ok": all_ok,
                }
            )
        )
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
