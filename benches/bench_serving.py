"""Online serving: replay a request trace against the OpenAI-compatible server.

Requests come from ../shared/data (Alpaca-like instructions, or ShareGPT-like
conversations with ``--dataset sharegpt``): the prompt is the conversation and
the output length is the token length of the reference answer (capped by
``--max-output-tokens``; ``ignore_eos`` makes the server produce exactly that
many). Arrivals are Poisson at each request rate of the sweep; every rate
replays its own slice of the data set. Each request streams through
``/v1/chat/completions``, so the client sees TTFT and TPOT.

Reported per rate: throughput (requests/s, output tokens/s), TTFT, TPOT
(time per output token after the first) and normalized latency (end-to-end
latency / output tokens, the paper's metric) at p50/p90/p99. The sweep is
printed as a table and plotted (normalized latency, TTFT and throughput vs
request rate) into a PNG.

Without ``--url`` it starts ``pagedrs serve`` on a free loopback port and stops
it afterwards.

    python benches/bench_serving.py [--request-rates 0.5,1,2,4] [--num-prompts 16]
        [--dataset alpaca|sharegpt] [--url http://127.0.0.1:8000] [--plot PATH] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from common import TraceRequest, load_trace, print_table


@dataclass
class Result:
    """What the client saw of one request (times in seconds)."""

    ok: bool
    ttft: float = math.nan
    e2e: float = math.nan
    output_tokens: int = 0
    prompt_tokens: int = 0
    error: str = ""
    chunk_times: list[float] = field(default_factory=list)


async def send(client: httpx.AsyncClient, model: str, req: TraceRequest) -> Result:
    """Stream one chat completion; time its first token and its end."""
    body = {
        "model": model,
        "messages": req.messages,
        "max_tokens": req.output_len,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    res = Result(ok=False)
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                res.error = f"HTTP {r.status_code}: {(await r.aread()).decode()[:200]}"
                return res
            async for line in r.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    res.error = event["error"]["message"]
                    return res
                if event.get("usage"):
                    res.output_tokens = event["usage"]["completion_tokens"]
                    res.prompt_tokens = event["usage"]["prompt_tokens"]
                for c in event.get("choices", []):
                    if c["delta"].get("content"):
                        now = time.perf_counter() - t0
                        if math.isnan(res.ttft):
                            res.ttft = now
                        res.chunk_times.append(now)
        res.e2e = time.perf_counter() - t0
        res.ok = res.output_tokens > 0
    except httpx.HTTPError as exc:
        res.error = f"{type(exc).__name__}: {exc}"
    return res


async def run_rate(
    url: str, model: str, trace: list[TraceRequest], rate: float, seed: int, headers: dict[str, str]
) -> tuple[list[Result], float]:
    """Send ``trace`` with Poisson arrivals at ``rate`` requests/s (inf: all at once).

    Returns:
        the results in trace order and the wall time from the first send to the
        last completion, in seconds.
    """
    rng = random.Random(seed)
    limits = httpx.Limits(max_connections=len(trace) + 8, max_keepalive_connections=len(trace))
    async with httpx.AsyncClient(
        base_url=url, timeout=httpx.Timeout(1800.0), limits=limits, headers=headers
    ) as client:
        tasks = []
        t0 = time.perf_counter()
        for req in trace:
            tasks.append(asyncio.ensure_future(send(client, model, req)))
            if math.isfinite(rate):
                await asyncio.sleep(rng.expovariate(rate))
        results = await asyncio.gather(*tasks)
        return list(results), time.perf_counter() - t0


def summarize(rate: float, results: list[Result], duration: float) -> dict[str, Any]:
    """Throughput and latency percentiles of one rate (latencies in seconds)."""
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    ttft = np.array([r.ttft for r in ok])
    tpot = np.array([(r.e2e - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1])
    norm = np.array([r.e2e / r.output_tokens for r in ok])

    def pct(a: np.ndarray) -> dict[str, float]:
        if a.size == 0:
            return {"mean": math.nan, "p50": math.nan, "p90": math.nan, "p99": math.nan}
        p50, p90, p99 = np.percentile(a, [50, 90, 99])
        return {"mean": float(a.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99)}

    return {
        "request_rate": rate,
        "num_requests": len(results),
        "num_errors": len(results) - len(ok),
        "errors": sorted({r.error for r in results if not r.ok})[:3],
        "duration_s": duration,
        "throughput_rps": len(ok) / duration,
        "output_tokens_per_s": out_tokens / duration,
        "mean_prompt_tokens": float(np.mean([r.prompt_tokens for r in ok])) if ok else math.nan,
        "mean_output_tokens": out_tokens / len(ok) if ok else math.nan,
        "ttft_s": pct(ttft),
        "tpot_s": pct(tpot),
        "normalized_latency_s_per_token": pct(norm),
    }


def scrape(url: str, headers: dict[str, str]) -> dict[str, float]:
    """Unlabelled-by-bucket samples of /metrics (name -> value)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    text = httpx.get(f"{url}/metrics", headers=headers, timeout=10).text
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if "le" not in s.labels and "finished_reason" not in s.labels:
                out[s.name] = s.value
    return out


def json_safe(x: Any) -> Any:
    """``x`` with non-finite floats as strict JSON allows: inf -> "inf", NaN -> None."""
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, list):
        return [json_safe(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None if math.isnan(x) else ("inf" if x > 0 else "-inf")
    return x


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


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen[bytes], str]:
    """``pagedrs serve`` on a free loopback port; returns it and its URL once healthy.

    Raises:
        RuntimeError: it exited or did not answer /health within 180 s.
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [
        sys.executable, "-m", "pagedrs.cli", "serve", args.model, "--port", str(port),
        "--max-model-len", str(args.max_model_len), "--log-level", "warning",
        "--max-waiting-requests", "100000",
    ]  # fmt: skip
    if args.torch_threads is not None:
        cmd += ["--torch-threads", str(args.torch_threads)]
    proc = subprocess.Popen(cmd, env=dict(os.environ))
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    proc.terminate()
    raise RuntimeError("the server did not become healthy in 180 s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--url", default=None, help="a running server (default: start one)")
    ap.add_argument("--model", default="smollm2-135m-instruct", help="served model name")
    ap.add_argument("--api-key", default=os.environ.get("PAGEDRS_API_KEY"))
    ap.add_argument("--dataset", default="alpaca", choices=["alpaca", "sharegpt"])
    ap.add_argument("--num-prompts", type=int, default=16, help="requests per rate")
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
    args = ap.parse_args()

    from pagedrs.executor.model_loader import resolve_model
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model("smollm2-135m-instruct")[0])
    trace = load_trace(args.dataset, tokenizer, args.max_output_tokens, args.max_prompt_tokens)
    rates = [float(r) for r in args.request_rates.split(",")]
    need = args.num_prompts * len(rates)
    if len(trace) < need:
        raise SystemExit(f"{args.dataset} has {len(trace)} usable requests, the sweep needs {need}")
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}

    proc = None
    url = args.url
    if url is None:
        proc, url = start_server(args)
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
            proc.terminate()
            proc.wait(30)

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


if __name__ == "__main__":
    main()
