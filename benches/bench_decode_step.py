"""CPU cost of one decode step, and where it stands against the machine's bound.

A decode step of ``S`` sequences (context lengths drawn from an exponential law of
mean ``--mean-context`` tokens, capped at ``--max-context``; blocks shuffled over the
pool, as after hours of serving; every context position holds random keys and values
written in the cache's format) runs through ``ModelRunner.execute`` of the default
model, for each combination of model code and attention:

  transformers + torch   HF's modules, the torch reference attention (each step
                         gathers every context into a copy padded to the longest)
  transformers + rust    HF's modules, the Rust CPU kernels (K/V read in place)
  pagedrs + rust         pagedrs' own fused Llama code + the Rust kernels (default)

Bound: the step is matmul work of ``2 * params`` FLOP per token (weights of the
decoder and LM head), so decode throughput cannot exceed ``peak / (2 * params)``
tokens/s, with ``peak`` the fp32 matmul rate measured here (``--matmul-size``).
Those rows run ``--dtype`` weights over a ``--kv-cache-dtype`` KV cache.

Then, in the same run, the default configuration (pagedrs + rust) for each
weights / KV cache dtype pair of ``--dtype-configs`` (default float32/auto,
bfloat16/auto, bfloat16/int8), timed in interleaved rounds (best of ``--rounds``,
so a drift of the host's speed shifts every pair alike): the "configs" table
and JSON section.

    python benches/bench_decode_step.py [--batch-sizes 16,64,256] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from typing import Any

import numpy as np
import torch
from common import json_safe, print_table
from pagedrs._core import KVCacheGroupBatch, StepBatch
from pagedrs.engine.arg_utils import EngineArgs
from pagedrs.engine.llm_engine import LLMEngine

CONFIGS = {
    "transformers + torch": {"model_impl": "transformers", "attention_backend": "torch"},
    "transformers + rust": {"model_impl": "transformers"},
    "pagedrs + rust": {"model_impl": "pagedrs"},
}


def matmul_gflops(n: int, reps: int = 5) -> float:
    """fp32 GFLOP/s of an ``n x n x n`` matmul (best of ``reps``)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = math.inf
    for _ in range(reps):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best / 1e9


def decode_step(
    num_seqs: int, mean_ctx: int, max_ctx: int, block_size: int, num_blocks: int, seed: int
) -> StepBatch:
    """The batch of a pure decode step (as ``Scheduler.schedule()`` builds it)."""
    rng = np.random.default_rng(seed)
    lens = np.clip(rng.exponential(mean_ctx, num_seqs).astype(np.int64) + 8, 8, max_ctx)
    need = -(-lens // block_size)
    if need.sum() > num_blocks:
        raise SystemExit(f"{need.sum()} blocks needed, the pool has {num_blocks}")
    perm = rng.permutation(num_blocks)
    tables = np.zeros((num_seqs, need.max()), np.int32)
    slots, used = [], 0
    for i in range(num_seqs):
        tables[i, : need[i]] = perm[used : used + need[i]]
        used += need[i]
        pos = lens[i] - 1
        slots.append(tables[i, pos // block_size] * block_size + pos % block_size)
    rows = np.arange(num_seqs)
    return StepBatch(
        input_ids=rng.integers(0, 49152, num_seqs).astype(np.int64),
        positions=(lens - 1).astype(np.int64),
        query_start_loc=np.arange(num_seqs + 1, dtype=np.int32),
        seq_lens=lens.astype(np.int32),
        seq_request_ids=rows.astype(np.uint64),
        kv_groups=[KVCacheGroupBatch(np.array(slots, np.int64), tables)],
        logits_indices=rows.astype(np.int64),
        sample_request_ids=rows.astype(np.uint64),
        temperature=np.zeros(num_seqs, np.float32),
        top_p=np.ones(num_seqs, np.float32),
        top_k=np.full(num_seqs, -1, np.int32),
        seed=np.full(num_seqs, -1, np.int64),
        num_output_tokens=np.ones(num_seqs, np.int64),
        num_samples=np.ones(num_seqs, np.int32),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-sizes", default="16,64,256", help="sequences per step")
    ap.add_argument("--mean-context", type=int, default=344, help="tokens (ShareGPT-like)")
    ap.add_argument("--max-context", type=int, default=1024, help="tokens")
    ap.add_argument("--reps", type=int, default=3, help="timed steps per point (median)")
    ap.add_argument(
        "--rounds", type=int, default=3, help="interleaved rounds of the dtype configs (best)"
    )
    ap.add_argument(
        "--torch-max-batch", type=int, default=64, help="skip the torch path above this batch"
    )
    ap.add_argument("--matmul-size", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--dtype", default="float32", choices=EngineArgs.CHOICES["dtype"])
    ap.add_argument(
        "--kv-cache-dtype", default="auto", choices=EngineArgs.CHOICES["kv_cache_dtype"]
    )
    ap.add_argument(
        "--dtype-configs",
        nargs="*",
        default=["float32/auto", "bfloat16/auto", "bfloat16/int8"],
        help="WEIGHTS/KV_CACHE_DTYPE pairs run with pagedrs + rust; none: skip",
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    sizes = [int(x) for x in args.batch_sizes.split(",")]

    peak = matmul_gflops(args.matmul_size)
    rows, result = [], {"threads": torch.get_num_threads(), "matmul_gflops": peak, "steps": {}}
    dtypes = {"dtype": args.dtype, "kv_cache_dtype": args.kv_cache_dtype}
    for name, kwargs in CONFIGS.items():
        engine = LLMEngine(EngineArgs(max_model_len=2048, **kwargs, **dtypes))
        params = sum(p.numel() for p in engine.engine_core.model.parameters())
        bound = peak * 1e9 / (2 * params)
        result.update(params=params, bound_tokens_per_s=bound)
        for s, dt, ctx in time_steps(engine, sizes, args, torch_path=name.endswith("torch")):
            tps = s / dt
            result["steps"].setdefault(name, {})[s] = {
                "step_ms": dt * 1e3,
                "tokens_per_s": tps,
                "share_of_bound": tps / bound,
            }
            rows.append([name, s, ctx, dt * 1e3, tps, tps / bound])
        engine.shutdown()
    print(
        f"fp32 matmul {args.matmul_size}^3: {peak:.0f} GFLOP/s on {torch.get_num_threads()} "
        f"threads; {params / 1e6:.0f}M parameters -> decode bound {bound:.0f} tokens/s"
    )
    print_table(
        f"Decode step (ModelRunner.execute, default model, {args.dtype} weights, "
        f"kv_cache_dtype {args.kv_cache_dtype})",
        ["model + attention", "seqs", "mean ctx", "step ms", "tokens/s", "of bound"],
        rows,
    )
    if args.dtype_configs:
        result["configs"] = dtype_configs(args.dtype_configs, sizes, args)
    if args.json:
        print(json.dumps(json_safe(result)))


def fill_contexts(runner: Any, step: StepBatch, seed: int) -> None:
    """Write random keys and values (normal, in the model dtype, stored in the
    cache's format) at every context position of ``step``'s sequences, in
    every cache pair: the kernels then read real memory, as in serving (a
    block never written is the OS's shared zero page, always in the CPU cache)."""
    spec = runner.spec
    tables = step.kv_groups[0].block_tables
    bs = spec.block_size
    slots = np.concatenate(
        [
            tables[i, np.arange(n) // bs].astype(np.int64) * bs + np.arange(n) % bs
            for i, n in enumerate(step.seq_lens)
        ]
    )
    gen = torch.Generator().manual_seed(seed)
    shape = (len(slots), spec.num_kv_heads, spec.head_dim)
    slot_mapping = torch.from_numpy(slots)
    for key_cache, value_cache in runner.kv_caches:
        key = torch.randn(shape, generator=gen).to(spec.dtype)
        value = torch.randn(shape, generator=gen).to(spec.dtype)
        runner.attention.write_kv(key, value, key_cache, value_cache, slot_mapping)


def time_steps(
    engine: LLMEngine, sizes: list[int], args: argparse.Namespace, torch_path: bool = False
) -> list[tuple[int, float, int]]:
    """(sequences, median step seconds, mean context) of a decode step of each
    size through the engine's runner (the torch path only up to
    ``--torch-max-batch``)."""
    runner = engine.engine_core.runner
    num_blocks = runner.kv_caches[0][0].shape[0]
    out = []
    for s in sizes:
        if torch_path and s > args.torch_max_batch:
            continue
        step = decode_step(s, args.mean_context, args.max_context, 16, num_blocks, seed=s)
        fill_contexts(runner, step, seed=s)
        runner.execute(step)  # warm-up
        times = []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            runner.execute(step)
            times.append(time.perf_counter() - t0)
        out.append((s, statistics.median(times), int(step.seq_lens.mean())))
    return out


def dtype_configs(
    pairs: list[str], sizes: list[int], args: argparse.Namespace
) -> dict[str, dict[str, float]]:
    """Tokens/s of the default configuration per ``WEIGHTS/KV`` pair and size
    (``{"float32/auto": {"16": tok/s, ...}, ...}``), with a table.

    Every pair's engine is built and its contexts written first; then
    ``--rounds`` rounds time each (pair, size) in turn, and each keeps its
    best round (the median of ``--reps`` steps): a host that slows down or
    speeds up during the run then shifts every pair alike."""
    engines, steps = {}, {}
    for pair in pairs:
        weights, _, kv = pair.partition("/")
        engine = LLMEngine(
            EngineArgs(max_model_len=2048, dtype=weights, kv_cache_dtype=kv or "auto")
        )
        runner = engine.engine_core.runner
        engines[pair] = engine
        for s in sizes:
            step = decode_step(s, args.mean_context, args.max_context, 16, _blocks(runner), seed=s)
            fill_contexts(runner, step, seed=s)
            runner.execute(step)  # warm-up
            steps[pair, s] = step
    best: dict[tuple[str, int], float] = {}
    for _ in range(args.rounds):
        for (pair, s), step in steps.items():
            runner = engines[pair].runner
            times = []
            for _ in range(args.reps):
                t0 = time.perf_counter()
                runner.execute(step)
                times.append(time.perf_counter() - t0)
            best[pair, s] = min(best.get((pair, s), float("inf")), statistics.median(times))
    configs: dict[str, dict[str, float]] = {}
    rows = []
    for (pair, s), dt in best.items():
        configs.setdefault(pair, {})[str(s)] = s / dt
        base = configs.get(pairs[0], {}).get(str(s))
        ctx = int(steps[pair, s].seq_lens.mean())
        backend = engines[pair].runner.attention.name
        rows.append([pair, backend, s, ctx, dt * 1e3, s / dt, (s / dt) / base if base else 1.0])
    for engine in engines.values():
        engine.shutdown()
    print_table(
        f"Decode step by weights / kv_cache_dtype (pagedrs + default attention backend; "
        f"best of {args.rounds} interleaved rounds)",
        ["weights/kv", "backend", "seqs", "mean ctx", "step ms", "tokens/s", f"x {pairs[0]}"],
        rows,
    )
    return configs


def _blocks(runner: Any) -> int:
    """Blocks of the runner's KV cache pool."""
    return runner.kv_caches[0][0].shape[0]


if __name__ == "__main__":
    main()
