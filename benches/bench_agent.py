"""Multi-turn agent traffic on the OpenAI server: TTFT and end-to-end latency per
turn, with the prefix cache on and off, for 1 and several concurrent agents.

An agent session is ``--turns`` chat requests over one growing conversation, the
loop an agent framework runs: a system prompt with tool definitions and a user
task; then per turn the model calls a tool, the agent runs it and appends the
call and its result, and sends the whole history again; the last turn asks for
the answer. The tasks are Alpaca instructions from ../shared/data and each tool
result is the reference output of a following record (cut to
``--tool-result-chars`` characters), so the history grows by a tool call and a
result each turn. Tool turns use ``tool_choice="required"`` (one call, the
arguments constrained to the tool's schema, so the 135M default model makes a
valid call); the model's own call goes into the history (a reply cut by
``max_tokens`` is replaced by a scripted call, counted as ``fallback_calls``).
The answer turn uses ``tool_choice="none"`` and ``ignore_eos``.

Servers run side by side (``--configs``: ``on`` and ``off``, the prefix cache
on and off; ``on-structured``, on with ``--structured-tool-calls``, so that the
calls are written in the hermes format the chat template renders them back in;
each with the tools chat template) and the configurations are interleaved: for
each repetition, each number of agents, each server. Every run uses sessions
of its own (its own records), so the only prefix shared across sessions is the
system prompt with its tools, which a warm-up session puts in the cache, as on
a server that has been serving this agent. TTFT is the time to the first
streamed token (the request asks for logprobs, so the first token arrives in a
chunk even while the tool-call parser holds its text back); end-to-end is the
time to the end of the stream. Per turn: prompt tokens, the cached ones
(``usage.prompt_tokens_details.cached_tokens``), the new ones (prefilled:
prompt - cached), TTFT per new token, and with ``--token-breakdown`` the
previous turn's prompt tokens this one starts with (``/tokenize`` between
turns, untimed). With ``--server-timing`` (one agent), ``/metrics`` is read
between turns and each turn's TTFT split by the server's own clocks: queued
(``request_queue_time_seconds``: from the request's arrival in the engine,
tokenized, to its first step), prefill (``request_prefill_time_seconds``: from
that step's start to the first token in the front end) and the rest of the
client's TTFT (HTTP, chat template, tokenizing, the first chunk's way back).
The prefix-cache hit rate is the server's ``prefix_cache_hits`` /
``prefix_cache_queries`` over the run (from ``/metrics``).

Goal (issue 32): with the cache on, turn-``--turns`` TTFT at most 1.5x turn-1
TTFT while the history grows several-fold.

    python benches/bench_agent.py [--turns 8] [--agents 1,8] [--repeats 2]
        [--configs on,off,on-structured] [--tool-result-chars 600]
        [--torch-threads N] [--token-breakdown] [--server-timing] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from common import print_table, read_data
from serving_client import json_safe, scrape, start_server, stop_server

TEMPLATE = (
    Path(__file__).resolve().parents[1]
    / "python/pagedrs/entrypoints/openai/chat_templates/chatml_tools.jinja"
)
SYSTEM = (
    "You are a research assistant. Work on the user's task step by step: look things "
    "up with the tools, read what they return, and call them again until you know "
    "enough; then answer in a few sentences."
)


def _tool(name: str, description: str, props: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": props,
                "required": list(props),
                "additionalProperties": False,
            },
        },
    }


_TEXT = {"type": "string", "maxLength": 40}
TOOLS = [
    _tool("search", "Search the web; returns the best page's text.", {"query": _TEXT}),
    _tool("lookup", "Look a term up in an encyclopedia.", {"term": _TEXT}),
    _tool(
        "calculator",
        "Evaluate an arithmetic expression.",
        {"expression": {"type": "string", "maxLength": 30}},
    ),
]


# The servers a run compares: prefix cache on and off, and on with tool calls
# held to the hermes format the chat template renders them back in.
CONFIGS = {
    "on": ["--enable-prefix-caching"],
    "off": ["--no-enable-prefix-caching"],
    "on-structured": ["--enable-prefix-caching", "--structured-tool-calls"],
}


@dataclass
class Session:
    """One agent's task: the user's message and the tool results it will get, in order."""

    task: str
    tool_results: list[str]


def make_sessions(n: int, turns: int, result_chars: int) -> list[Session]:
    """``n`` sessions of ``turns`` turns from the Alpaca records, ``turns`` records each.

    Raises:
        SystemExit: the data set holds too few records.
    """
    records = read_data("alpaca_en_demo.json")
    if n * turns > len(records):
        raise SystemExit(f"{n} sessions of {turns} turns need {n * turns} records")
    out = []
    for s in range(n):
        recs = records[s * turns : (s + 1) * turns]
        task = recs[0]["instruction"] + (("\n\n" + recs[0]["input"]) if recs[0]["input"] else "")
        out.append(Session(task, [r["output"][:result_chars] for r in recs[1:]]))
    return out


@dataclass
class Turn:
    """What the client saw of one turn (times in seconds)."""

    ttft: float = math.nan
    e2e: float = math.nan
    # prompt_tokens - cached_tokens is what the turn prefilled; kept_tokens is
    # the length of the previous turn's prompt that starts this one (-1: not
    # measured, or the first turn).
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    kept_tokens: int = -1
    # --server-timing: the server's queued and prefill time of this request (s).
    queue_s: float = math.nan
    prefill_s: float = math.nan
    calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None
    error: str = ""


async def chat_turn(
    client: httpx.AsyncClient, model: str, messages: list[dict[str, Any]], body: dict[str, Any]
) -> Turn:
    """Stream one chat completion; time the first token and the end; collect its calls."""
    req = {
        "model": model,
        "messages": messages,
        "tools": TOOLS,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "logprobs": True,
        "top_logprobs": 0,
        **body,
    }
    turn = Turn()
    calls: dict[int, dict[str, Any]] = {}
    t0 = time.perf_counter()
    try:
        async with client.stream("POST", "/v1/chat/completions", json=req) as r:
            if r.status_code != 200:
                turn.error = f"HTTP {r.status_code}: {(await r.aread()).decode()[:200]}"
                return turn
            async for line in r.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    turn.error = event["error"]["message"]
                    return turn
                if event.get("usage"):
                    usage = event["usage"]
                    turn.prompt_tokens = usage["prompt_tokens"]
                    turn.completion_tokens = usage["completion_tokens"]
                    details = usage.get("prompt_tokens_details") or {}
                    turn.cached_tokens = details.get("cached_tokens") or 0
                for c in event.get("choices", []):
                    d = c["delta"]
                    lp = (c.get("logprobs") or {}).get("content")
                    if math.isnan(turn.ttft) and (lp or d.get("content") or d.get("tool_calls")):
                        turn.ttft = time.perf_counter() - t0
                    for t in d.get("tool_calls") or []:
                        call = calls.setdefault(t["index"], {"id": None, "name": "", "args": ""})
                        call["id"] = t.get("id") or call["id"]
                        fn = t.get("function") or {}
                        call["name"] += fn.get("name") or ""
                        call["args"] += fn.get("arguments") or ""
                    if c.get("finish_reason"):
                        turn.finish_reason = c["finish_reason"]
        turn.e2e = time.perf_counter() - t0
    except httpx.HTTPError as exc:
        turn.error = f"{type(exc).__name__}: {exc}"
    turn.calls = [calls[i] for i in sorted(calls)]
    return turn


async def prompt_ids(
    client: httpx.AsyncClient, model: str, messages: list[dict[str, Any]]
) -> list[int]:
    """The turn's prompt as the server renders and tokenizes it (``/tokenize``)."""
    body = {"model": model, "messages": messages, "tools": TOOLS, "add_generation_prompt": True}
    r = await client.post("/tokenize", json=body)
    r.raise_for_status()
    return list(r.json()["tokens"])


_TIMES = ("request_queue_time_seconds", "request_prefill_time_seconds")


async def server_times(client: httpx.AsyncClient) -> list[float]:
    """The server's running sums of queued and prefill time (s) and their count."""
    from prometheus_client.parser import text_string_to_metric_families

    r = await client.get("/metrics")
    r.raise_for_status()
    values = {
        s.name: s.value
        for fam in text_string_to_metric_families(r.text)
        for s in fam.samples
        if s.name.startswith("pagedrs:")
    }
    return [
        *(values.get(f"pagedrs:{n}_sum", 0.0) for n in _TIMES),
        values.get(f"pagedrs:{_TIMES[0]}_count", 0.0),
    ]


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


async def run_session(
    client: httpx.AsyncClient,
    model: str,
    session: Session,
    tool_tokens: int,
    answer_tokens: int,
    breakdown: bool = False,
    timing: bool = False,
) -> tuple[list[Turn], int]:
    """One agent's loop: tool turns, then the answer turn (``timing``: the
    server's queued / prefill time of each turn, from ``/metrics`` read
    between turns; only this agent may be running).

    Returns:
        the turns in order and the number of scripted calls used for replies
        that were cut before their call was complete.
    """
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": session.task},
    ]
    turns, fallbacks = [], 0
    previous: list[int] | None = None

    async def timed_turn(body: dict[str, Any]) -> Turn:
        nonlocal previous
        before = await server_times(client) if timing else []
        turn = await chat_turn(client, model, messages, body)
        if timing and not turn.error:  # between turns: not timed
            after = await server_times(client)
            if after[2] - before[2] == 1:  # this request's only
                turn.queue_s, turn.prefill_s = after[0] - before[0], after[1] - before[1]
        if breakdown:
            ids = await prompt_ids(client, model, messages)
            if previous is not None:
                turn.kept_tokens = common_prefix(previous, ids)
            previous = ids
        return turn

    for k, result in enumerate(session.tool_results):
        body = {"tool_choice": "required", "parallel_tool_calls": False, "max_tokens": tool_tokens}
        turn = await timed_turn(body)
        turns.append(turn)
        if turn.error:
            return turns, fallbacks
        call_id = f"call_{k}"
        name, args = "search", json.dumps({"query": session.task[:40]})
        if turn.finish_reason == "tool_calls" and turn.calls:
            call = turn.calls[0]
            call_id, name, args = call["id"] or call_id, call["name"], call["args"]
        else:
            fallbacks += 1
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": name, "arguments": args},
                    }
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": call_id, "content": result})
    body = {"tool_choice": "none", "max_tokens": answer_tokens, "ignore_eos": True}
    turns.append(await timed_turn(body))
    return turns, fallbacks


async def run_agents(
    url: str,
    model: str,
    sessions: list[Session],
    tool_tokens: int,
    answer_tokens: int,
    breakdown: bool = False,
    timing: bool = False,
) -> tuple[list[list[Turn]], int, float]:
    """Every session at once, one agent each; returns their turns, the fallback
    calls and the wall time (s)."""
    limits = httpx.Limits(max_connections=len(sessions) + 4)
    async with httpx.AsyncClient(
        base_url=url, timeout=httpx.Timeout(1800.0), limits=limits
    ) as client:
        t0 = time.perf_counter()
        done = await asyncio.gather(
            *(
                run_session(client, model, s, tool_tokens, answer_tokens, breakdown, timing)
                for s in sessions
            )
        )
        wall = time.perf_counter() - t0
    return [t for t, _ in done], sum(f for _, f in done), wall


def _hits(m: dict[str, float]) -> tuple[float, float]:
    return m.get("pagedrs:prefix_cache_hits_total", 0.0), m.get(
        "pagedrs:prefix_cache_queries_total", 0.0
    )


def _p50(xs: list[float]) -> float:
    return float(np.median(xs)) if xs else math.nan


def summarize(runs: list[dict[str, Any]], turns: int) -> dict[str, Any]:
    """Per-turn means and medians over the runs of one configuration."""
    per_turn = []
    errors = [t.error for r in runs for s in r["turns"] for t in s if t.error]
    for k in range(turns):
        ts = [s[k] for r in runs for s in r["turns"] if len(s) > k and not s[k].error]
        ttft = np.array([t.ttft for t in ts])
        e2e = np.array([t.e2e for t in ts])
        new = np.array([t.prompt_tokens - t.cached_tokens for t in ts])
        kept = [t.kept_tokens for t in ts if t.kept_tokens >= 0]
        timed = [t for t in ts if not math.isnan(t.prefill_s)]
        per_turn.append(
            {
                "turn": k + 1,
                "n": len(ts),
                "prompt_tokens": float(np.mean([t.prompt_tokens for t in ts])) if ts else math.nan,
                "cached_tokens": float(np.mean([t.cached_tokens for t in ts])) if ts else math.nan,
                "new_tokens": float(new.mean()) if ts else math.nan,
                "kept_tokens": float(np.mean(kept)) if kept else math.nan,
                "ttft_ms_per_new_token_p50": float(np.median(ttft * 1e3 / np.maximum(new, 1)))
                if ts
                else math.nan,
                "completion_tokens": float(np.mean([t.completion_tokens for t in ts]))
                if ts
                else math.nan,
                "ttft_s_mean": float(ttft.mean()) if ts else math.nan,
                "ttft_s_p50": float(np.median(ttft)) if ts else math.nan,
                "e2e_s_mean": float(e2e.mean()) if ts else math.nan,
                "e2e_s_p50": float(np.median(e2e)) if ts else math.nan,
                # --server-timing: the server's split of the TTFT (s, p50 over the runs).
                "queue_s_p50": _p50([t.queue_s for t in timed]),
                "prefill_s_p50": _p50([t.prefill_s for t in timed]),
                "rest_s_p50": _p50([t.ttft - t.queue_s - t.prefill_s for t in timed]),
            }
        )
    hits = sum(r["hits"] for r in runs)
    queries = sum(r["queries"] for r in runs)
    first, last = per_turn[0], per_turn[-1]
    return {
        "turns": per_turn,
        "ttft_ratio_last_first_p50": last["ttft_s_p50"] / first["ttft_s_p50"],
        "ttft_ratio_last_first_mean": last["ttft_s_mean"] / first["ttft_s_mean"],
        "prompt_growth": last["prompt_tokens"] / first["prompt_tokens"],
        "new_token_ratio_last_first": last["new_tokens"] / first["new_tokens"],
        "prefix_cache_hit_rate": hits / queries if queries else math.nan,
        "fallback_calls": sum(r["fallbacks"] for r in runs),
        "session_wall_s_mean": float(np.mean([r["wall"] for r in runs])),
        "num_errors": len(errors),
        "errors": sorted(set(errors))[:3],
    }


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), or the platform's processor string."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--turns", type=int, default=8, help="requests per session (the last answers)")
    ap.add_argument("--agents", default="1,8", help="concurrent agents, comma-separated")
    ap.add_argument("--repeats", type=int, default=2, help="runs of each configuration")
    ap.add_argument("--tool-result-chars", type=int, default=600, help="cut of each tool result")
    ap.add_argument("--tool-tokens", type=int, default=48, help="max_tokens of a tool turn")
    ap.add_argument("--answer-tokens", type=int, default=32, help="tokens of the answer turn")
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--torch-threads", type=int, default=None, help="of each server")
    ap.add_argument(
        "--configs",
        default="on,off",
        help=f"servers, comma-separated, of {', '.join(CONFIGS)} (default: %(default)s)",
    )
    ap.add_argument(
        "--token-breakdown",
        action="store_true",
        help="between turns, /tokenize each prompt: the previous prompt's tokens it starts with",
    )
    ap.add_argument(
        "--server-timing",
        action="store_true",
        help="between turns, read /metrics: each turn's queued and prefill time (--agents 1)",
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object last")
    args = ap.parse_args()
    if args.turns < 2:
        raise SystemExit("--turns must be >= 2 (tool turns, then the answer)")
    agents = [int(a) for a in args.agents.split(",")]
    if args.server_timing and agents != [1]:
        raise SystemExit("--server-timing needs --agents 1 (the server's sums are per turn)")
    caches = {c: CONFIGS[c] for c in args.configs.split(",")}
    n_sessions = len(caches) * (1 + args.repeats * sum(agents))
    sessions = make_sessions(n_sessions, args.turns, args.tool_result_chars)
    common = [
        "--chat-template", str(TEMPLATE), "--enable-auto-tool-choice",
        "--tool-call-parser", "hermes",
    ]  # fmt: skip
    if args.torch_threads is not None:
        common += ["--torch-threads", str(args.torch_threads)]

    load_start = os.getloadavg()
    servers: dict[str, tuple[Any, str]] = {}
    results: dict[tuple[str, int], list[dict[str, Any]]] = {
        (c, a): [] for c in caches for a in agents
    }
    try:
        for cache, flags in caches.items():
            servers[cache] = start_server(
                args.model, args.max_model_len, [*common, *flags], timeout_s=900
            )
        nxt = 0
        for _, url in servers.values():  # warm-up: the grammar, the system prompt's blocks
            warm = Session(sessions[nxt].task, sessions[nxt].tool_results[:1])
            asyncio.run(run_agents(url, args.model, [warm], args.tool_tokens, 4))
            nxt += 1
        for rep in range(args.repeats):
            for a in agents:
                for cache, (_, url) in servers.items():
                    before = _hits(scrape(url, {}))
                    turns, fallbacks, wall = asyncio.run(
                        run_agents(
                            url,
                            args.model,
                            sessions[nxt : nxt + a],
                            args.tool_tokens,
                            args.answer_tokens,
                            args.token_breakdown,
                            args.server_timing,
                        )
                    )
                    nxt += a
                    after = _hits(scrape(url, {}))
                    results[(cache, a)].append(
                        {
                            "turns": turns,
                            "fallbacks": fallbacks,
                            "wall": wall,
                            "hits": after[0] - before[0],
                            "queries": after[1] - before[1],
                        }
                    )
                    print(
                        f"repeat {rep}: {a} agent(s), prefix cache {cache}: {wall:.1f} s",
                        file=sys.stderr,
                    )
    finally:
        for proc, _ in servers.values():
            stop_server(proc)

    summary = {f"cache_{c}_agents_{a}": summarize(r, args.turns) for (c, a), r in results.items()}
    cpu = cpu_name()
    rows = []
    for (c, a), _ in results.items():
        s = summary[f"cache_{c}_agents_{a}"]
        for t in s["turns"]:
            rows.append(
                [
                    c,
                    a,
                    t["turn"],
                    round(t["prompt_tokens"]),
                    round(t["cached_tokens"]),
                    round(t["new_tokens"]),
                    t["kept_tokens"],
                    round(t["completion_tokens"]),
                    t["ttft_s_p50"] * 1e3,
                    t["ttft_ms_per_new_token_p50"],
                    t["ttft_s_mean"] * 1e3,
                    t["queue_s_p50"] * 1e3,
                    t["prefill_s_p50"] * 1e3,
                    t["rest_s_p50"] * 1e3,
                    t["e2e_s_p50"] * 1e3,
                ]
            )
    print_table(
        f"Agent sessions of {args.turns} turns, {args.model}, {cpu} "
        f"({os.cpu_count()} cores), {args.repeats} repeats (times in ms)",
        [
            "cache",
            "agents",
            "turn",
            "prompt tok",
            "cached tok",
            "new tok",
            "kept tok",
            "out tok",
            "TTFT p50",
            "TTFT/new tok",
            "TTFT mean",
            "queued",
            "prefill",
            "rest",
            "e2e p50",
        ],
        rows,
    )
    print_table(
        f"Turn {args.turns} vs turn 1",
        ["cache", "agents", "prompt growth", "new tok ratio", "TTFT ratio p50", "TTFT ratio mean",
         "hit rate", "fallback calls", "errors"],
        [
            [c, a, s["prompt_growth"], s["new_token_ratio_last_first"],
             s["ttft_ratio_last_first_p50"],
             s["ttft_ratio_last_first_mean"], s["prefix_cache_hit_rate"], s["fallback_calls"],
             s["num_errors"]]
            for (c, a) in results
            for s in [summary[f"cache_{c}_agents_{a}"]]
        ],
    )  # fmt: skip
    if args.json:
        print(
            json.dumps(
                json_safe(
                    {
                        "benchmark": "bench_agent",
                        "model": args.model,
                        "cpu": cpu,
                        "cpu_count": os.cpu_count(),
                        "turns": args.turns,
                        "agents": agents,
                        "repeats": args.repeats,
                        "tool_result_chars": args.tool_result_chars,
                        "tool_tokens": args.tool_tokens,
                        "answer_tokens": args.answer_tokens,
                        "max_model_len": args.max_model_len,
                        "loadavg_start": load_start,
                        "loadavg_end": os.getloadavg(),
                        "configs": summary,
                    }
                )
            )
        )


if __name__ == "__main__":
    main()
