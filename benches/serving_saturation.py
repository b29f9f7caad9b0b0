"""The saturated server against the offline engine, on the same requests, in
one run (``bench_serving.py --mode saturation``).

1. Offline: ``LLM.generate`` on the trace's chat-templated prompts (greedy,
   ``ignore_eos``, each request's output length): output tokens/s.
2. For each server configuration: ``pagedrs serve`` started here;
   - unloaded: a few requests one after another (TPOT with nothing else running);
   - saturated: every request at once (output tokens/s; its requests/s is the
     saturation rate);
   - half load: Poisson arrivals at half the saturation rate (TPOT p50).

Reported: saturated / offline output tokens/s, and TPOT p50 at half load /
unloaded TPOT, per configuration.
"""

from __future__ import annotations

import asyncio
import gc
import math
import os
import time
from typing import Any

import numpy as np
from common import TraceRequest
from serving_client import run_rate, start_server, stop_server, summarize

# name -> extra ``pagedrs serve`` flags: "process" runs the engine core in its
# own process (the default), "thread" in a thread of the HTTP process; the
# number is torch's threads for the model.
CONFIGS: dict[str, list[str]] = {
    "process:2": ["--torch-threads", "2"],
    "process:1": ["--torch-threads", "1"],
    "thread:1": ["--no-engine-core-process", "--torch-threads", "1"],
    "thread:2": ["--no-engine-core-process", "--torch-threads", "2"],
}
DEFAULT_CONFIG = "process:2"
NUM_UNLOADED = 3


def offline_tokens_per_s(
    model: str, max_model_len: int, tokenizer: Any, trace: list[TraceRequest]
) -> dict[str, float]:
    """Output tokens/s of ``LLM.generate`` on the trace (after a one-request warm-up)."""
    import torch
    from pagedrs import LLM, SamplingParams

    torch.set_num_threads(os.cpu_count() or 1)
    llm = LLM(model=model, max_model_len=max_model_len)
    prompts = []
    for r in trace:  # as the server renders and tokenizes a chat
        text = tokenizer.apply_chat_template(r.messages, tokenize=False, add_generation_prompt=True)
        prompts.append({"prompt_token_ids": tokenizer(text, add_special_tokens=False).input_ids})
    params = [
        SamplingParams(temperature=0.0, max_tokens=r.output_len, ignore_eos=True) for r in trace
    ]
    llm.generate(prompts[:1], params[:1], use_tqdm=False)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - t0
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    del llm
    gc.collect()
    return {"output_tokens_per_s": tokens / elapsed, "duration_s": elapsed, "output_tokens": tokens}


def measure_server(
    model: str, max_model_len: int, extra: list[str], trace: list[TraceRequest], seed: int
) -> dict[str, Any]:
    """Unloaded, saturated and half-load figures of one server configuration."""
    proc, url = start_server(model, max_model_len, extra)
    try:
        asyncio.run(run_rate(url, model, trace[:1], math.inf, seed, {}))  # warm-up
        unloaded = []
        for req in trace[:NUM_UNLOADED]:
            res, _ = asyncio.run(run_rate(url, model, [req], math.inf, seed, {}))
            unloaded += res
        tpot_alone = float(
            np.median([(r.e2e - r.ttft) / (r.output_tokens - 1) for r in unloaded if r.ok])
        )
        res, dur = asyncio.run(run_rate(url, model, trace, math.inf, seed, {}))
        saturated = summarize(math.inf, res, dur)
        half_rate = saturated["throughput_rps"] / 2
        res, dur = asyncio.run(run_rate(url, model, trace, half_rate, seed + 1, {}))
        half = summarize(half_rate, res, dur)
    finally:
        stop_server(proc)
    return {
        "unloaded_tpot_s": tpot_alone,
        "saturated": saturated,
        "half_load": half,
        "saturation_rps": saturated["throughput_rps"],
        "tpot_p50_half_load_s": half["tpot_s"]["p50"],
        "tpot_ratio": half["tpot_s"]["p50"] / tpot_alone,
    }


def run(
    model: str,
    max_model_len: int,
    tokenizer: Any,
    trace: list[TraceRequest],
    configs: list[str],
    seed: int,
) -> dict[str, Any]:
    """The offline figure, then every configuration's server figures."""
    offline = offline_tokens_per_s(model, max_model_len, tokenizer, trace)
    print(f"offline: {offline['output_tokens_per_s']:.1f} output tokens/s", flush=True)
    servers: dict[str, Any] = {}
    for name in configs:
        row = measure_server(model, max_model_len, CONFIGS[name], trace, seed)
        row["saturation_ratio"] = (
            row["saturated"]["output_tokens_per_s"] / offline["output_tokens_per_s"]
        )
        servers[name] = row
        print(
            f"{name}: {row['saturated']['output_tokens_per_s']:.1f} tok/s saturated "
            f"({row['saturation_ratio']:.2f} of offline), TPOT p50 at half load "
            f"{row['tpot_p50_half_load_s'] * 1e3:.0f} ms = {row['tpot_ratio']:.2f}x unloaded",
            flush=True,
        )
    return {"offline": offline, "servers": servers}


def table_rows(result: dict[str, Any]) -> list[list[Any]]:
    """One row per configuration for ``print_table``."""
    rows = []
    for name, r in result["servers"].items():
        s, h = r["saturated"], r["half_load"]
        rows.append(
            [
                name,
                s["output_tokens_per_s"],
                r["saturation_ratio"],
                s["ttft_s"]["p50"],
                s["tpot_s"]["p50"],
                r["unloaded_tpot_s"],
                h["request_rate"],
                h["tpot_s"]["p50"],
                r["tpot_ratio"],
                s["num_errors"] + h["num_errors"],
            ]
        )
    return rows


TABLE_HEADER = [
    "server", "sat tok/s", "/offline", "sat TTFT p50", "sat TPOT p50", "unloaded TPOT",
    "half rate", "half TPOT p50", "/unloaded", "errors",
]  # fmt: skip
