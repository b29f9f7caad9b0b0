"""The cost of prefilling new tokens after a cached prefix, by prefix length:
what an agent's later turn pays for attending over a longer history.

For each cached prefix length C (``--contexts``) and new-token count N
(``--new-tokens``), a prompt of C tokens runs first (its blocks enter the
prefix cache), then a prompt of the same C tokens and N new ones: the time of
that second request to its first token, in the engine (``LLMEngine``, no
server), its ``num_cached_tokens`` checked to be C. The configurations are
interleaved, repetition by repetition; each prompt is Alpaca text after a
first token of its own, so no two share a block (block hashes are chained).
Reported: the median time, time per new token, the CPU time of this process
(all its threads; on a machine shared with other jobs the steadier figure), and
the ratio of each to the shortest context's.

    python benches/bench_prefill_context.py [--contexts 0,400,800,1200]
        [--new-tokens 128] [--repeats 5] [--torch-threads 1] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import numpy as np
import torch
from common import alpaca_prompts, print_table
from pagedrs import EngineArgs, LLMEngine, SamplingParams


def token_stream(tokenizer: Any, n: int) -> list[int]:
    """``n`` token ids of Alpaca text, records joined."""
    ids: list[int] = []
    for text in alpaca_prompts(1000):
        ids += tokenizer.encode(text, add_special_tokens=False)
        if len(ids) >= n:
            return ids[:n]
    raise SystemExit(f"the Alpaca records hold fewer than {n} tokens")


def first_token_s(engine: LLMEngine, rid: str, prompt: list[int]) -> tuple[float, float, int]:
    """Seconds from adding ``prompt`` to its first output (wall and this
    process's CPU time), and its cached tokens."""
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    t0, c0 = time.perf_counter(), time.process_time()
    engine.add_request(rid, prompt, params)
    cached = -1
    while engine.has_unfinished_requests():
        for out in engine.step():
            cached = out.num_cached_tokens if out.num_cached_tokens is not None else -1
    return time.perf_counter() - t0, time.process_time() - c0, cached


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--contexts", default="0,400,800,1200", help="cached prefix lengths")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--torch-threads", type=int, default=1)
    ap.add_argument("--json", action="store_true", help="print one JSON object last")
    args = ap.parse_args()
    torch.set_num_threads(args.torch_threads)
    contexts = [int(c) for c in args.contexts.split(",")]
    bs = 16
    if any(c % bs for c in contexts):
        raise SystemExit(f"--contexts must be multiples of the block size {bs}")
    engine = LLMEngine(EngineArgs(model=args.model, max_model_len=4096, block_size=bs))
    per = max(contexts) + args.new_tokens
    stream = token_stream(engine.tokenizer, per - 1)
    times: dict[int, list[float]] = {c: [] for c in contexts}
    cpu: dict[int, list[float]] = {c: [] for c in contexts}
    k = 0
    for rep in range(args.repeats + 1):  # the first repetition warms up
        for c in contexts:
            k += 1
            ids = [1000 + k, *stream[: c + args.new_tokens - 1]]
            if c:
                first_token_s(engine, f"p{k}", ids[:c])
            dt, dc, cached = first_token_s(engine, f"r{k}", ids)
            if cached != c:
                raise SystemExit(f"context {c}: {cached} tokens found cached, expected {c}")
            if rep:
                times[c].append(dt)
                cpu[c].append(dc)
    base = float(np.median(times[contexts[0]]))
    cpu_base = float(np.median(cpu[contexts[0]]))
    rows, out = [], []
    for c in contexts:
        med, cmed = float(np.median(times[c])), float(np.median(cpu[c]))
        rows.append(
            [
                c,
                args.new_tokens,
                med * 1e3,
                med * 1e3 / args.new_tokens,
                med / base,
                cmed * 1e3,
                cmed / cpu_base,
            ]
        )
        out.append(
            {
                "context": c,
                "new_tokens": args.new_tokens,
                "s_p50": med,
                "ratio": med / base,
                "cpu_s_p50": cmed,
                "cpu_ratio": cmed / cpu_base,
            }
        )
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in open("/proc/cpuinfo")
            if line.startswith("model name")
        ),
        "unknown",
    )
    print_table(
        f"Prefill of {args.new_tokens} new tokens after a cached prefix, {args.model}, {cpu} "
        f"({os.cpu_count()} cores), {args.torch_threads} torch thread(s), "
        f"median of {args.repeats}",
        [
            "cached tokens",
            "new tokens",
            "time ms",
            "ms / new token",
            "vs first",
            "CPU ms",
            "CPU vs first",
        ],
        rows,
    )
    if args.json:
        record = {"benchmark": "bench_prefill_context", "cpu": cpu, "loadavg": os.getloadavg()}
        print(json.dumps({**record, "results": out}))


if __name__ == "__main__":
    main()
