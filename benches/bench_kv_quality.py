"""Quality and capacity of each KV cache dtype (``kv_cache_dtype``) against a
float32 KV cache on the same weights, on the default model.

For each weights dtype (``--weights``: float32, bfloat16) the baseline is an
engine with ``kv_cache_dtype="float32"``; every other KV cache dtype runs the
same inputs and is compared with it:

* teacher forced: ``--texts`` ShareGPT-like replies (the ``chosen`` answers of
  ../shared/data/dpo_en_demo.json with at least 64 tokens), each cut to
  ``--text-tokens`` tokens, run as prompts with ``prompt_logprobs=0``: the
  logprob the model gives each actual next token. ``mean_abs_dlogprob`` /
  ``max_abs_dlogprob``: mean / max over all positions of |logprob - the
  baseline's|; ``perplexity``: ``exp(-mean logprob)`` over the same positions.
  A prompt is one prefill, which attends over the cache's stored (quantized)
  keys and values, as every later step does.
* greedy: ``--requests`` Alpaca-like instructions, ``--greedy-tokens`` greedy
  tokens each (``ignore_eos``); ``greedy_agreement``: share of requests whose
  tokens equal the baseline's. These run the decode kernels of the attention
  backend (``--attention-backend``, default auto: the Rust kernels on CPU).
* capacity: KV cache bytes per block of the default model (keys and values of
  every layer, int8 scales included) and ``capacity_vs_float32``, how many
  times the tokens of a float32 KV cache fit in the same budget.

    python benches/bench_kv_quality.py [--texts 16] [--requests 16] [--json]

With ``--json`` the last line is one JSON object: ``{"capacity_vs_float32":
{kv dtype: x}, "bytes_per_block": {...}, "quality": {"<weights>/<kv dtype>":
{"mean_abs_dlogprob", "max_abs_dlogprob", "greedy_agreement", "perplexity"}},
"setting": {...}}``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from typing import Any

import torch
from common import alpaca_prompts, json_safe, print_table, read_data
from pagedrs import LLM, SamplingParams
from pagedrs.engine.arg_utils import EngineArgs
from pagedrs.executor.kv_cache import KVCacheSpec
from pagedrs.executor.model_loader import load_model, local_model_path
from pagedrs.executor.model_registry import DEFAULT_MODEL

KV_DTYPES = ("bfloat16", "fp8_e4m3", "fp8_e5m2", "int8")
BASELINE = "float32"


def texts(tokenizer: Any, n: int, length: int) -> list[list[int]]:
    """Token ids of the first ``n`` ShareGPT-like replies with >= 64 tokens, cut
    to ``length`` tokens."""
    out = []
    for r in read_data("dpo_en_demo.json"):
        ids = tokenizer(r["chosen"]["value"]).input_ids
        if len(ids) >= 64:
            out.append(list(ids[:length]))
        if len(out) == n:
            break
    return out


def run(
    weights: str, kv: str, args: argparse.Namespace, text_ids: list[list[int]], prompts: list[str]
) -> dict[str, Any]:
    """One engine's teacher-forced logprobs (per text, per position) and
    greedy tokens (per request)."""
    t0 = time.perf_counter()
    llm = LLM(
        model=args.model,
        dtype=weights,
        kv_cache_dtype=kv,
        attention_backend=args.attention_backend,
        max_model_len=1024,
        kv_cache_memory_bytes=256 << 20,
        max_num_seqs=max(args.requests, args.texts),
    )
    try:
        forced = llm.generate(
            [{"prompt_token_ids": ids} for ids in text_ids],
            SamplingParams(max_tokens=1, prompt_logprobs=0),
            use_tqdm=False,
        )
        logprobs = []
        for ids, out in zip(text_ids, forced, strict=True):
            plp = out.prompt_logprobs or []
            logprobs.append([plp[i][ids[i]].logprob for i in range(1, len(ids))])  # type: ignore[index]
        greedy = llm.generate(
            prompts,
            SamplingParams(temperature=0.0, max_tokens=args.greedy_tokens, ignore_eos=True),
            use_tqdm=False,
        )
        tokens = [list(o.outputs[0].token_ids) for o in greedy]
        stats = llm.kv_cache_stats()
    finally:
        llm.llm_engine.shutdown()
    return {
        "logprobs": logprobs,
        "tokens": tokens,
        "bytes_per_block": stats["bytes_per_block"],
        "seconds": time.perf_counter() - t0,
    }


def compare(base: dict[str, Any], res: dict[str, Any]) -> dict[str, float]:
    """The quality figures of ``res`` against the baseline run ``base``."""
    diffs = [
        abs(a - b)
        for xs, ys in zip(res["logprobs"], base["logprobs"], strict=True)
        for a, b in zip(xs, ys, strict=True)
    ]
    flat = [x for xs in res["logprobs"] for x in xs]
    agree = sum(a == b for a, b in zip(res["tokens"], base["tokens"], strict=True))
    return {
        "mean_abs_dlogprob": sum(diffs) / len(diffs),
        "max_abs_dlogprob": max(diffs),
        "greedy_agreement": agree / len(res["tokens"]),
        "perplexity": math.exp(-sum(flat) / len(flat)),
    }


def capacity(model: str) -> dict[str, dict[str, float]]:
    """Bytes per block and the capacity against float32 of each KV cache dtype,
    for the model's KV shape (block size 16)."""
    config = load_model(local_model_path(model), torch.float32, torch.device("cpu")).config
    out = {}
    base = None
    for kv in (BASELINE, *KV_DTYPES):
        spec = KVCacheSpec.from_config(config, 16, torch.float32, kv_cache_dtype=kv)
        base = base or spec.bytes_per_block
        out[kv] = {
            "bytes_per_block": spec.bytes_per_block,
            "vs_float32": base / spec.bytes_per_block,
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--weights", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--kv-cache-dtypes", nargs="+", default=list(KV_DTYPES), choices=KV_DTYPES)
    ap.add_argument("--texts", type=int, default=16, help="teacher-forced texts")
    ap.add_argument("--text-tokens", type=int, default=256, help="tokens per text")
    ap.add_argument("--requests", type=int, default=16, help="greedy requests")
    ap.add_argument("--greedy-tokens", type=int, default=64)
    ap.add_argument(
        "--attention-backend",
        default="auto",
        choices=EngineArgs.CHOICES["attention_backend"],
    )
    ap.add_argument("--json", action="store_true", help="one JSON object as the last line")
    args = ap.parse_args()

    cap = capacity(args.model)
    print_table(
        f"KV cache capacity, {args.model} (block size 16, all layers, keys and values)",
        ["kv_cache_dtype", "bytes/block", "x float32"],
        [[kv, c["bytes_per_block"], c["vs_float32"]] for kv, c in cap.items()],
    )
    probe = LLM(model=args.model, max_model_len=1024, kv_cache_memory_bytes=64 << 20)
    tok = probe.get_tokenizer()
    probe.llm_engine.shutdown()
    text_ids = texts(tok, args.texts, args.text_tokens)
    prompts = alpaca_prompts(args.requests)

    quality: dict[str, dict[str, float]] = {}
    rows = []
    for weights in args.weights:
        base = run(weights, BASELINE, args, text_ids, prompts)
        for kv in (BASELINE, *args.kv_cache_dtypes):
            res = base if kv == BASELINE else run(weights, kv, args, text_ids, prompts)
            q = compare(base, res)
            quality[f"{weights}/{kv}"] = q
            rows.append(
                [
                    weights,
                    kv,
                    f"{q['mean_abs_dlogprob']:.4f}",
                    f"{q['max_abs_dlogprob']:.4f}",
                    f"{q['greedy_agreement']:.3f}",
                    f"{q['perplexity']:.3f}",
                    res["seconds"],
                ]
            )
    n_pos = sum(len(t) - 1 for t in text_ids)
    print_table(
        f"KV cache dtype quality against float32 KV on the same weights: {len(text_ids)} "
        f"teacher-forced ShareGPT-like replies ({n_pos} positions), {len(prompts)} Alpaca "
        f"prompts x {args.greedy_tokens} greedy tokens",
        ["weights", "kv_cache_dtype", "mean |dlogp|", "max |dlogp|", "greedy agree", "ppl", "s"],
        rows,
    )
    if args.json:
        print(
            json.dumps(
                json_safe(
                    {
                        "capacity_vs_float32": {
                            kv: c["vs_float32"] for kv, c in cap.items() if kv != BASELINE
                        },
                        "bytes_per_block": {kv: c["bytes_per_block"] for kv, c in cap.items()},
                        "quality": quality,
                        "setting": {
                            "model": args.model,
                            "texts": len(text_ids),
                            "text_tokens": args.text_tokens,
                            "positions": n_pos,
                            "requests": len(prompts),
                            "greedy_tokens": args.greedy_tokens,
                            "attention_backend": args.attention_backend,
                            "threads": torch.get_num_threads(),
                        },
                    }
                )
            )
        )


if __name__ == "__main__":
    main()
