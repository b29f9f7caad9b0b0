"""Do greedy outputs depend on the batch, the prefix cache or chunking? Per dtype.

For each weights / KV cache dtype pair (``--dtype-configs``), ``--prompts`` Alpaca
chats are decoded greedily (``--max-tokens`` tokens, EOS ignored so every run has
the same length) in pairs of runs that should give the same tokens, and the
table counts the requests whose token ids are equal (equal / total):

  alone vs batch      each prompt alone in the engine vs all of them in one
                      batch of ``--batch`` requests (the rest other prompts)
  cache miss vs hit   a first run (prefix cache cold) vs the same requests again
                      (their prompts' full blocks come from the prefix cache)
  chunked vs whole    prompts prefilled in chunks of ``--chunk`` tokens
                      (``max_num_batched_tokens``) vs whole

The Rust CPU kernels reduce each query token in one fixed order (decode and
prefill alike), so what can still differ is the matmuls: the second table
counts, per dtype, shape and batch size ``M``, the rows of the model's projection
(``executor.models.linear.Linear``: ``F.linear`` for float32, oneDNN on a
prepacked weight for bfloat16) over the default model's MLP shapes whose bits
equal those of the same row computed alone.

    python benches/bench_invariance.py [--dtype-configs float32/auto bfloat16/auto] [--json]
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch
from common import alpaca_prompts, json_safe, print_table
from pagedrs import LLM, SamplingParams
from pagedrs.engine.arg_utils import EngineArgs
from pagedrs.executor.models.linear import Linear


def run(llm: LLM, prompts: list[list[dict[str, str]]], max_tokens: int) -> list[list[int]]:
    """Greedy token ids of each chat (EOS ignored)."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    outs = llm.chat(prompts, params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def equal(a: list[list[int]], b: list[list[int]]) -> str:
    """``"k/n"``: requests whose token ids are equal."""
    return f"{sum(x == y for x, y in zip(a, b, strict=True))}/{len(a)}"


def engine_checks(pair: str, args: argparse.Namespace) -> dict[str, str]:
    """The three comparisons for one ``WEIGHTS/KV`` pair."""
    weights, _, kv = pair.partition("/")
    chats = [[{"role": "user", "content": p}] for p in alpaca_prompts(args.batch)]
    probes = chats[: args.prompts]
    common: dict[str, Any] = {
        "dtype": weights,
        "kv_cache_dtype": kv or "auto",
        "max_model_len": 2048,
        "seed": 0,
    }
    result = {}
    llm = LLM(**common, enable_prefix_caching=False)
    alone = [run(llm, [c], args.max_tokens)[0] for c in probes]
    batch = run(llm, chats, args.max_tokens)[: args.prompts]
    result["alone_vs_batch"] = equal(alone, batch)
    llm.shutdown()

    llm = LLM(**common, enable_prefix_caching=True)
    miss = run(llm, probes, args.max_tokens)
    hit = run(llm, probes, args.max_tokens)
    hits = llm.kv_cache_stats().get("prefix_cache_hits", None)
    result["miss_vs_hit"] = equal(miss, hit)
    llm.shutdown()

    chunked = LLM(
        **common,
        enable_prefix_caching=False,
        enable_chunked_prefill=True,
        max_num_batched_tokens=args.chunk,
    )
    part = run(chunked, probes, args.max_tokens)
    chunked.shutdown()
    result["chunked_vs_whole"] = equal(part, miss)
    if hits is not None:
        result["prefix_cache_hit_tokens"] = str(hits)
    return result


#: (in_features, out_features) of the default model's MLP projections.
MATMUL_SHAPES = [(576, 1536), (1536, 576)]


def matmul_checks(dtypes: list[str], sizes: list[int]) -> dict[str, dict[str, dict[str, str]]]:
    """Per dtype, shape ``KxN`` and ``M``: rows of ``x @ W.T`` (``[M, K] x [N, K]``,
    the default model's MLP shapes) through the model's ``Linear`` equal, bit for
    bit, to each row computed alone."""
    gen = torch.Generator().manual_seed(0)
    out: dict[str, dict[str, dict[str, str]]] = {}
    for name in dtypes:
        dt = getattr(torch, name)
        for k, n in MATMUL_SHAPES:
            lin = Linear(torch.randn(n, k, generator=gen).to(dt))
            for m in sizes:
                x = torch.randn(m, k, generator=gen).to(dt)
                together = lin(x)
                same = sum(bool(torch.equal(lin(x[i : i + 1])[0], together[i])) for i in range(m))
                out.setdefault(name, {}).setdefault(f"{k}x{n}", {})[str(m)] = f"{same}/{m}"
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--dtype-configs",
        nargs="*",
        default=["float32/auto", "float32/int8", "bfloat16/auto", "bfloat16/int8"],
        help="WEIGHTS/KV_CACHE_DTYPE pairs",
    )
    ap.add_argument("--prompts", type=int, default=16, help="requests compared")
    ap.add_argument("--batch", type=int, default=64, help="requests in the batched run")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--chunk", type=int, default=32, help="prefill chunk (tokens)")
    ap.add_argument("--matmul-sizes", default="2,7,16,64,256,1000")
    ap.add_argument("--threads", type=int, default=None, help="torch threads")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    for pair in args.dtype_configs:
        w, _, kv = pair.partition("/")
        EngineArgs(dtype=w, kv_cache_dtype=kv or "auto")  # fail fast on a bad pair

    engine = {pair: engine_checks(pair, args) for pair in args.dtype_configs}
    print_table(
        f"Greedy outputs equal (requests, {args.max_tokens} tokens each)",
        ["weights/kv", "alone vs batch", "miss vs hit", "chunked vs whole"],
        [
            [p, r["alone_vs_batch"], r["miss_vs_hit"], r["chunked_vs_whole"]]
            for p, r in engine.items()
        ],
    )
    sizes = [int(s) for s in args.matmul_sizes.split(",")]
    weights = sorted({p.partition("/")[0] for p in args.dtype_configs})
    mm = matmul_checks(weights, sizes)
    print_table(
        "Projection rows equal to the row computed alone ([M, K] x [K, N])",
        ["dtype", "K x N", *[f"M={m}" for m in sizes]],
        [[d, shape, *[mm[d][shape][str(m)] for m in sizes]] for d in weights for shape in mm[d]],
    )
    if args.json:
        print(
            json.dumps(
                json_safe(
                    {"threads": torch.get_num_threads(), "engine": engine, "matmul_rows_equal": mm}
                )
            )
        )


if __name__ == "__main__":
    main()
