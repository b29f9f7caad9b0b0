"""KV memory saved by sharing blocks inside a request (paper §6.3, Fig. 15):
parallel sampling (n = 2, 4, 6) and beam search (k = 2, 4, 6) on the
Alpaca-like and ShareGPT-like data in ../shared/data, with the default model.

Each step, after the scheduler has run, it records the device blocks in use
(shared blocks counted once) and the blocks the same block tables would hold
without sharing (every sequence its own copy). Saving = 1 - used / unshared,
summed over steps (a time average, as the paper plots). Prefix caching is off,
so only sharing inside a request counts. Outputs run to the reference output
length (ignore_eos), capped by --max-tokens.

    python benches/bench_sharing.py [--num-requests 16] [--max-tokens 64] [--json]
"""

from __future__ import annotations

import argparse
import json
import time

from common import load_trace, print_table
from pagedrs import BeamSearchParams, LLMEngine, SamplingParams
from pagedrs.engine.arg_utils import EngineArgs

PAPER = {  # % of KV memory saved, paper Fig. 15 (OPT-13B)
    ("alpaca", "parallel"): "6.1-9.8",
    ("sharegpt", "parallel"): "16.2-30.5",
    ("alpaca", "beam"): "37.6-55.2",
    ("sharegpt", "beam"): "44.3-66.3",
}


def run(engine: LLMEngine, prompts: list[list[int]], lens: list[int], mode: str, width: int):
    """Drive one workload to completion; return (saving, seconds, steps)."""
    for i, (p, n_out) in enumerate(zip(prompts, lens, strict=True)):
        if mode == "parallel":
            sp = SamplingParams(n=width, temperature=1.0, seed=i, max_tokens=n_out, ignore_eos=True)
            engine.add_request(f"{mode}{width}-{i}", p, sp)
        else:
            bp = BeamSearchParams(beam_width=width, max_tokens=n_out, ignore_eos=True)
            engine.add_beam_search_request(f"{mode}{width}-{i}", p, bp)
    used = unshared = steps = 0
    t0 = time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
        stats = engine.kv_cache_stats()
        used += stats["num_used_blocks"]
        unshared += stats["num_table_blocks"]
        steps += 1
    return 1 - used / max(unshared, 1), time.perf_counter() - t0, steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--num-requests", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--widths", type=int, nargs="+", default=[2, 4, 6])
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    engine = LLMEngine(
        EngineArgs(block_size=args.block_size, enable_prefix_caching=False, max_model_len=2048)
    )
    tok = engine.tokenizer
    rows, figures = [], {}
    for dataset in ("alpaca", "sharegpt"):
        trace = load_trace(dataset, tok, args.max_tokens, 1024)[: args.num_requests]
        prompts = [
            tok(
                tok.apply_chat_template(r.messages, tokenize=False, add_generation_prompt=True),
                add_special_tokens=False,
            ).input_ids
            for r in trace
        ]
        lens = [r.output_len for r in trace]
        mean_p, mean_o = sum(map(len, prompts)) / len(prompts), sum(lens) / len(lens)
        for mode in ("parallel", "beam"):
            for width in args.widths:
                saving, secs, steps = run(engine, prompts, lens, mode, width)
                figures[f"{dataset}/{mode}/{width}"] = saving
                rows.append(
                    [
                        dataset,
                        f"{mean_p:.0f}/{mean_o:.0f}",
                        mode,
                        width,
                        100 * saving,
                        PAPER[(dataset, mode)],
                        steps,
                        secs,
                    ]
                )
    print_table(
        f"KV memory saved by sharing ({args.num_requests} requests per data set, block size "
        f"{args.block_size}, outputs <= {args.max_tokens} tokens)",
        ["data", "prompt/output", "mode", "n or k", "saved %", "paper %", "steps", "seconds"],
        rows,
    )
    if args.json:
        print(json.dumps({"saving": figures}))


if __name__ == "__main__":
    main()
