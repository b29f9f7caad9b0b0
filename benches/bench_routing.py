"""Routing data-parallel replicas by the prefix cache: 2 engine replicas on a
local Ray Serve (one torch thread each), a multi-turn chat workload, one run
per request router.

Workload (from ../shared/data): ``--system-prompts`` shared system prompts
(reference answers of dpo_en_demo.json, cut to ``--system-tokens`` tokens) and
``--sessions`` chat sessions of ``--turns`` turns, each on one system prompt;
turn k sends the system prompt, the k-1 earlier exchanges and the k-th user
message (Alpaca instructions, with their recorded answers as the assistant's
replies, cut to ``--reply-tokens`` tokens), so the histories grow and every
router sees the same prompts. Sessions start as a Poisson process
(``--session-rate``), at most ``--concurrency`` at once, each sending its next
turn when the last one has finished; every reply is ``--max-tokens`` tokens
(``ignore_eos``), streamed. Before the clock starts, a few unrelated requests
warm every replica up (their prefix-cache counts are subtracted).

Routers: ``round_robin``, ``power_of_two`` (Ray Serve's default),
``ray_prefix_affinity`` (Ray Serve LLM's ``PrefixCacheAffinityRouter``: a
prefix tree of prompt text, imported from Ray's internal module because
``ray.serve.llm`` needs pyarrow; it runs without vLLM) and ``pagedrs``
(``pagedrs.serve.router.PrefixCacheRouter``: exact block hashes from the
replicas' KV events). Each router gets fresh replicas (empty caches).

Figures per router: the prefix-cache hit rate (prompt tokens found cached /
prompt tokens looked up, summed over the replicas, from the server's
``/metrics``), TTFT p50 and p90 (client side, to the first streamed token) and
output tokens/s (all output tokens / the run's wall time). The machine's cores
are shared: figures are noisy.

    python benches/bench_routing.py [--sessions 16] [--turns 4] [--routers a,b] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import socket
import statistics
import sys
import time
from typing import Any

import httpx
from common import json_safe, poisson_arrivals, print_table, read_data

ROUTERS = ["round_robin", "power_of_two", "ray_prefix_affinity", "pagedrs"]


@dataclasses.dataclass
class Session:
    """A chat session: its system prompt and its turns (user message, recorded reply)."""

    system: str
    turns: list[tuple[str, str]]


def _cut(tokenizer: Any, text: str, n: int) -> str:
    ids = tokenizer(text, add_special_tokens=False).input_ids[:n]
    return str(tokenizer.decode(ids))


def build_sessions(tokenizer: Any, ns: argparse.Namespace) -> list[Session]:
    """The workload (see the module docstring)."""
    dpo = read_data("dpo_en_demo.json")
    alpaca = read_data("alpaca_en_demo.json")
    long_answers = sorted((r["chosen"]["value"] for r in dpo), key=len, reverse=True)
    systems = [
        "You are a helpful assistant. Answer in the style of this reference answer.\n\n"
        + _cut(tokenizer, text, ns.system_tokens)
        for text in long_answers[: ns.system_prompts]
    ]
    sessions = []
    for i in range(ns.sessions):
        turns = []
        for r in alpaca[i * ns.turns : (i + 1) * ns.turns]:
            user = r["instruction"] + (("\n\n" + r["input"]) if r.get("input") else "")
            turns.append((user, _cut(tokenizer, r["output"], ns.reply_tokens)))
        sessions.append(Session(systems[i % len(systems)], turns))
    return sessions


async def _turn(
    client: httpx.AsyncClient, model: str, messages: list[dict[str, str]], max_tokens: int
) -> tuple[float, int]:
    """One streamed chat request: (TTFT in s, output tokens)."""
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    ttft = None
    tokens = 0
    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread()).decode()[:300]}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data: ") :])
            if "error" in event:
                raise RuntimeError(f"stream error: {event['error']}")
            if ttft is None and any(c["delta"].get("content") for c in event["choices"]):
                ttft = time.perf_counter() - start
            if event.get("usage"):
                tokens = int(event["usage"]["completion_tokens"])
    return (ttft if ttft is not None else time.perf_counter() - start), tokens


async def warm_up(url: str, model: str, n: int) -> None:
    """``n`` short requests at once (unrelated prompts), so that every replica
    has run its model before the clock starts."""
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        await asyncio.gather(
            *(
                _turn(client, model, [{"role": "user", "content": f"Warm-up {i}: count."}], 2)
                for i in range(n)
            )
        )


async def run_sessions(
    url: str,
    model: str,
    sessions: list[Session],
    starts: list[float],
    concurrency: int,
    max_tokens: int,
) -> dict[str, Any]:
    """Every session, starting at ``starts`` (s) and at most ``concurrency`` at
    once; TTFTs, output tokens, wall time."""
    ttfts: list[float] = []
    tokens = 0
    gate = asyncio.Semaphore(concurrency)

    async def session(s: Session, start_s: float, client: httpx.AsyncClient) -> None:
        nonlocal tokens
        await asyncio.sleep(start_s)
        async with gate:
            history = [{"role": "system", "content": s.system}]
            for user, reply in s.turns:
                history.append({"role": "user", "content": user})
                ttft, n = await _turn(client, model, history, max_tokens)
                ttfts.append(ttft)
                tokens += n
                history.append({"role": "assistant", "content": reply})

    limits = httpx.Limits(max_connections=concurrency * 2)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        start = time.perf_counter()
        runs = [session(s, t, client) for s, t in zip(sessions, starts, strict=True)]
        await asyncio.gather(*runs)
        wall = time.perf_counter() - start
    return {"ttfts": ttfts, "output_tokens": tokens, "wall_s": wall}


def _prefix_cache(url: str) -> tuple[float, float]:
    """(prompt tokens looked up, found cached) over the replicas, from /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    got = {}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=30).text):
        for s in family.samples:
            got[s.name] = s.value
    return got["pagedrs:prefix_cache_queries_total"], got["pagedrs:prefix_cache_hits_total"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default=None, help="model (default: the packaged default)")
    p.add_argument("--routers", default=",".join(ROUTERS), help=f"comma-separated, of {ROUTERS}")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--sessions", type=int, default=16)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--system-prompts", type=int, default=4)
    p.add_argument("--system-tokens", type=int, default=256)
    p.add_argument("--reply-tokens", type=int, default=96)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--concurrency", type=int, default=8, help="most sessions at once")
    p.add_argument(
        "--session-rate",
        type=float,
        default=1.0,
        help="sessions start as a Poisson process of this rate (sessions/s; inf: all at once)",
    )
    p.add_argument(
        "--kv-cache-memory-bytes",
        type=int,
        default=320 << 20,
        help="KV budget of each replica (default 320 MiB: about 7k tokens of the default "
        "model, less than the sessions' histories, so a router that spreads a "
        "session over both replicas also evicts)",
    )
    p.add_argument("--json", action="store_true", help="print the figures as JSON last")
    ns = p.parse_args(argv)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # Ray's logging setup shows each request
    routers = ns.routers.split(",")
    for r in routers:
        if r not in ROUTERS:
            p.error(f"unknown router {r!r}; known: {ROUTERS}")

    import ray
    from pagedrs.engine.arg_utils import EngineArgs
    from pagedrs.executor.model_loader import hf_folder, load_tokenizer
    from pagedrs.executor.model_registry import DEFAULT_MODEL
    from pagedrs.serve import build_serve_app
    from ray import serve

    model = ns.model or DEFAULT_MODEL
    folder = hf_folder(model)
    tokenizer = load_tokenizer(folder, None, None, None)
    sessions = build_sessions(tokenizer, ns)
    starts = poisson_arrivals(len(sessions), ns.session_rate, seed=0)
    args = EngineArgs(
        model=str(folder),
        device="cpu",
        max_model_len=2048,
        kv_cache_memory_bytes=ns.kv_cache_memory_bytes,
    )
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    ray.init(
        num_cpus=ns.replicas + 2,
        include_dashboard=False,
        log_to_driver=False,
        object_store_memory=256 << 20,
    )
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    results: dict[str, dict[str, Any]] = {}
    try:
        for router in routers:
            app = build_serve_app(
                args,
                data_parallel_size=ns.replicas,
                router=router,
                served_model_names=["m"],
                torch_threads=1,
            )
            serve.run(app, name="pagedrs", route_prefix="/")
            asyncio.run(warm_up(url, "m", 2 * ns.replicas))
            queries0, hits0 = _prefix_cache(url)
            run = asyncio.run(
                run_sessions(url, "m", sessions, starts, ns.concurrency, ns.max_tokens)
            )
            queries, hits = _prefix_cache(url)
            queries, hits = queries - queries0, hits - hits0
            ttfts = sorted(run["ttfts"])
            results[router] = {
                "hit_rate": hits / queries if queries else 0.0,
                "ttft_p50_s": statistics.median(ttfts),
                "ttft_p90_s": ttfts[int(0.9 * (len(ttfts) - 1))],
                "output_tokens_per_s": run["output_tokens"] / run["wall_s"],
                "requests": len(ttfts),
                "prompt_tokens": queries,
                "wall_s": run["wall_s"],
            }
            print(f"{router}: {results[router]}", file=sys.stderr)
            serve.delete("pagedrs")
    finally:
        serve.shutdown()
        ray.shutdown()

    print_table(
        f"{ns.replicas} replicas, {ns.sessions} sessions x {ns.turns} turns, "
        f"{ns.system_prompts} system prompts, {ns.session_rate} sessions/s, at most "
        f"{ns.concurrency} at once, "
        f"{ns.max_tokens} output tokens each ({model}, 1 torch thread per replica)",
        ["router", "hit rate", "TTFT p50 s", "TTFT p90 s", "output tok/s", "wall s"],
        [
            [
                r,
                v["hit_rate"],
                v["ttft_p50_s"],
                v["ttft_p90_s"],
                v["output_tokens_per_s"],
                v["wall_s"],
            ]
            for r, v in results.items()
        ],
    )
    if ns.json:
        figures = {
            key: {r: v[key] for r, v in results.items()}
            for key in ("hit_rate", "ttft_p50_s", "output_tokens_per_s")
        }
        figures["ttft_p90_s"] = {r: v["ttft_p90_s"] for r, v in results.items()}
        figures["config"] = {k: v for k, v in vars(ns).items() if k != "json"}
        print(json.dumps(json_safe(figures)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
