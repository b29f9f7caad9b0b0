"""Online serving: the OpenAI-compatible server under load, from a real trace.

Requests come from ../shared/data (Alpaca-like instructions, or ShareGPT-like
conversations with ``--dataset sharegpt``): the prompt is the conversation and
the output length is the token length of the reference answer (capped by
``--max-output-tokens``; ``ignore_eos`` makes the server produce exactly that
many). Each request streams through ``/v1/chat/completions``, so the client sees
TTFT and TPOT (time per output token after the first).

``--mode saturation`` (default; ``serving_saturation.py``): the offline engine
and each server configuration (engine core process or in-process thread, torch
threads) on the same requests in one run: saturated output tokens/s against the
offline figure, and TPOT p50 at half the saturation rate against the unloaded
TPOT.

``--mode sweep``: Poisson arrivals at each request rate (every rate replays its
own slice of the data set); throughput, TTFT, TPOT and normalized latency
(end-to-end latency / output tokens, the paper's metric) at p50/p90/p99, as a
table and a PNG. Without ``--url`` it starts ``pagedrs serve`` on a free
loopback port and stops it afterwards.

    python benches/bench_serving.py [--num-prompts 64] [--configs NAME,...] [--json]
    python benches/bench_serving.py --mode sweep [--request-rates 0.5,1,2,4]
        [--num-prompts 16] [--dataset alpaca|sharegpt] [--url URL] [--plot PATH] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import serving_saturation
from common import TraceRequest, load_trace, print_table
from serving_client import json_safe, run_rate, scrape, start_server, stop_server, summarize


def plot(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    """Normalized latency, TTFT and throughput against the request rate, in a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if math.isfinite(r["request_rate"])]  # "inf" stays in the table
    rates = [r["request_rate"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    ax = axes[0]
    for q in ("p50", "p90", "p99"):
        ax.plot(rates, [r["normalized_latency_s_per_token"][q] for r in rows], "o-", label=q)
    ax.set(xlabel="request rate (req/s)", ylabel="normalized latency (s/token)")
    ax.set_title("Normalized latency (e2e / output tokens)")
    ax.legend()
    ax = axes[1]
    for q in ("p50", "p90", "p99"):
        ax.plot(rates, [r["ttft_s"][q] for r in rows], "o-", label=q)
    ax.set(xlabel="request rate (req/s)", ylabel="TTFT (s)", title="Time to first token")
    ax.legend()
    ax = axes[2]
    ax.plot(rates, [r["output_tokens_per_s"] for r in rows], "o-", label="output tokens/s")
    ax.set(xlabel="request rate (req/s)", ylabel="output tokens/s", title="Throughput")
    ax2 = ax.twinx()
    ax2.plot(rates, [r["throughput_rps"] for r in rows], "s--", color="gray", label="requests/s")
    ax2.set_ylabel("requests/s")
    for a in axes:
        a.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--url", default=None, help="a running server (default: start one)")
    ap.add_argument("--model", default="smollm2-135m-instruct", help="served model name")
    ap.add_argument("--api-key", default=os.environ.get("PAGEDRS_API_KEY"))
    ap.add_argument("--dataset", default="alpaca", choices=["alpaca", "sharegpt"])
    ap.add_argument(
        "--num-prompts",
        type=int,
        default=None,
        help="requests per rate (sweep, default 16) or in all (saturation, default 64)",
    )
    ap.add_argument(
        "--request-rates", default="0.5,1,2,4", help="comma-separated req/s; 'inf' = all at once"
    )
    ap.add_argument("--max-output-tokens", type=int, default=64, help="cap of output lengths")
    ap.add_argument("--max-prompt-tokens", type=int, default=768, help="longer prompts skipped")
    ap.add_argument("--max-model-len", type=int, default=1024, help="of a server started here")
    ap.add_argument("--torch-threads", type=int, default=None, help="of a server started here")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plot", default="bench_serving.png", help="PNG of the sweep")
    ap.add_argument("--json", action="store_true", help="print one JSON object last")
    ap.add_argument(
        "--mode",
        default="saturation",
        choices=["saturation", "sweep"],
        help="saturation: the saturated server against the offline engine on the same "
        "requests, per server configuration; sweep: latency and throughput per request rate",
    )
    ap.add_argument(
        "--configs",
        default=",".join(serving_saturation.CONFIGS),
        help="server configurations of --mode saturation, comma-separated, of: "
        + "; ".join(serving_saturation.CONFIGS),
    )
    args = ap.parse_args()

    from pagedrs.executor.model_loader import hf_folder
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(hf_folder("smollm2-135m-instruct"))
    trace = load_trace(args.dataset, tokenizer, args.max_output_tokens, args.max_prompt_tokens)
    if args.num_prompts is None:
        args.num_prompts = 64 if args.mode == "saturation" else 16
    if args.mode == "saturation":
        saturation_main(args, tokenizer, trace)
        return
    rates = [float(r) for r in args.request_rates.split(",")]
    need = args.num_prompts * len(rates)
    if len(trace) < need:
        raise SystemExit(f"{args.dataset} has {len(trace)} usable requests, the sweep needs {need}")
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}

    proc = None
    url = args.url
    if url is None:
        extra = [] if args.torch_threads is None else ["--torch-threads", str(args.torch_threads)]
        proc, url = start_server(args.model, args.max_model_len, extra)
    try:
        asyncio.run(run_rate(url, args.model, trace[:1], math.inf, args.seed, headers))  # warm-up
        rows = []
        for i, rate in enumerate(rates):
            part = trace[i * args.num_prompts : (i + 1) * args.num_prompts]
            before = scrape(url, headers)
            results, duration = asyncio.run(
                run_rate(url, args.model, part, rate, args.seed + i, headers)
            )
            after = scrape(url, headers)
            row = summarize(rate, results, duration)
            row["num_preemptions"] = after.get("pagedrs:num_preemptions_total", 0) - before.get(
                "pagedrs:num_preemptions_total", 0
            )
            rows.append(row)
            print(
                f"rate {rate:g} req/s: {row['throughput_rps']:.2f} req/s, "
                f"{row['output_tokens_per_s']:.1f} tok/s, errors {row['num_errors']}",
                file=sys.stderr,
            )
    finally:
        if proc is not None:
            stop_server(proc)

    print_table(
        f"Serving sweep: {args.dataset}, {args.num_prompts} requests per rate, "
        f"outputs <= {args.max_output_tokens} tokens (latencies in s)",
        ["rate", "req/s", "tok/s", "TTFT p50", "p90", "p99", "TPOT p50", "p90", "p99",
         "norm p50", "p90", "p99", "preempt", "errors"],
        [
            [
                r["request_rate"], r["throughput_rps"], r["output_tokens_per_s"],
                r["ttft_s"]["p50"], r["ttft_s"]["p90"], r["ttft_s"]["p99"],
                r["tpot_s"]["p50"], r["tpot_s"]["p90"], r["tpot_s"]["p99"],
                r["normalized_latency_s_per_token"]["p50"],
                r["normalized_latency_s_per_token"]["p90"],
                r["normalized_latency_s_per_token"]["p99"],
                int(r["num_preemptions"]), r["num_errors"],
            ]
            for r in rows
        ],
    )  # fmt: skip
    plot_path = Path(args.plot)
    plot(rows, plot_path, f"pagedrs serving: {args.model}, {args.dataset}")
    print(f"\nplot: {plot_path}")
    if args.json:
        print(
            json.dumps(
                json_safe(
                    {
                        "benchmark": "bench_serving",
                        "model": args.model,
                        "dataset": args.dataset,
                        "num_prompts_per_rate": args.num_prompts,
                        "max_output_tokens": args.max_output_tokens,
                        "plot": str(plot_path),
                        "rates": rows,
                    }
                )
            )
        )


def saturation_main(args: argparse.Namespace, tokenizer: Any, trace: list[TraceRequest]) -> None:
    """``--mode saturation``: print the table and, with --json, its figures."""
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in configs if c not in serving_saturation.CONFIGS]
    if unknown:
        raise SystemExit(f"unknown --configs {unknown}; known: {list(serving_saturation.CONFIGS)}")
    trace = trace[: args.num_prompts]
    result = serving_saturation.run(
        args.model, args.max_model_len, tokenizer, trace, configs, args.seed
    )
    print_table(
        f"Saturated server vs offline engine: {len(trace)} {args.dataset} requests, outputs <= "
        f"{args.max_output_tokens} tokens, offline "
        f"{result['offline']['output_tokens_per_s']:.1f} output tokens/s (latencies in s)",
        serving_saturation.TABLE_HEADER,
        serving_saturation.table_rows(result),
    )
    if args.json:
        default = result["servers"].get(serving_saturation.DEFAULT_CONFIG)
        summary = {
            "benchmark": "bench_serving",
            "mode": "saturation",
            "model": args.model,
            "dataset": args.dataset,
            "num_requests": len(trace),
            "max_output_tokens": args.max_output_tokens,
            "offline_output_tokens_per_s": result["offline"]["output_tokens_per_s"],
            "saturation_ratio": None if default is None else default["saturation_ratio"],
            "tpot_p50_ratio": None if default is None else default["tpot_ratio"],
            **result,
        }
        print(json.dumps(json_safe(summary)))


if __name__ == "__main__":
    main()
