"""The HTTP side of the serving benchmarks: stream chat completions from a
server, time them (TTFT, TPOT, end-to-end), summarize percentiles, and start
``pagedrs serve`` on a free loopback port."""

from __future__ import annotations

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
from typing import Any

import httpx
import numpy as np
from common import TraceRequest


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


def start_server(
    model: str,
    max_model_len: int,
    extra_args: list[str] | None = None,
    timeout_s: float = 180.0,
) -> tuple[subprocess.Popen[bytes], str]:
    """``pagedrs serve model`` on a free loopback port; returns it and its URL once healthy.

    Args:
        extra_args: more ``pagedrs serve`` flags (e.g. ``--torch-threads 2``).
        timeout_s: how long to wait for /health (s).
    Raises:
        RuntimeError: it exited or did not answer /health within ``timeout_s``.
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [
        sys.executable, "-m", "pagedrs.cli", "serve", model, "--port", str(port),
        "--max-model-len", str(max_model_len), "--log-level", "warning",
        "--max-waiting-requests", "100000", *(extra_args or []),
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, env=dict(os.environ))
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
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
    raise RuntimeError(f"the server did not become healthy in {timeout_s:g} s")


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    """Terminate a server started by ``start_server`` and wait for it."""
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
