"""docs/tools.md's agent-loop figures: the tables and the prose beside them
equal what ``benches/results/agent_*.json`` and ``prefill_context.json`` hold,
at the precision printed."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = "docs/tools.md"
ZEN4 = "agent_{n}agent_q4_1_zen4{jf}_2026-12-04.json"


def _results(name: str) -> Any:
    return json.loads((ROOT / "benches" / "results" / name).read_text())


def _zen4(agents: int, jump_forward: bool) -> dict[str, Any]:
    return dict(_results(ZEN4.format(n=agents, jf="_jf" if jump_forward else ""))["configs"])


def _config(configs: dict[str, Any], name: str) -> dict[str, Any]:
    (config,) = (v for k, v in configs.items() if k.startswith(f"cache_{name}_agents_"))
    return dict(config)


def _assert_says(*figures: str) -> None:
    text = " ".join((ROOT / PAGE).read_text().split())
    missing = [f for f in figures if f not in text]
    assert not missing, f"{PAGE} does not say {missing} (its results file does)"


def _time(s: float) -> str:
    """A time in s as the tables print it: 2 decimals, 3 digits from 10 s."""
    return f"{s:.2f}" if s < 10 else f"{s:.1f}"


def _turn_cells(config: dict[str, Any]) -> list[str]:
    turns = config["turns"]
    middle = [t["ttft_s_p50"] for t in turns[1:-1]]
    return [
        f"{turns[0]['prompt_tokens']:.0f} → {turns[-1]['prompt_tokens']:.0f}",
        f"{turns[0]['new_tokens']:.0f} / {turns[-1]['new_tokens']:.0f}",
        _time(turns[0]["ttft_s_p50"]),
        f"{_time(min(middle))}-{_time(max(middle))}",
        _time(turns[-1]["ttft_s_p50"]),
        f"{config['ttft_ratio_last_first_p50']:.2f}",
    ]


@pytest.mark.parametrize("jump_forward", [False, True], ids=["before", "jump-forward"])
def test_zen4_tables(jump_forward: bool) -> None:
    rows = []
    for agents in (1, 8):
        for name, config in _zen4(agents, jump_forward).items():
            cache = name.removeprefix("cache_").split("_agents_")[0]
            cells = [str(agents), cache, *_turn_cells(config)]
            cells += [f"{config['prefix_cache_hit_rate']:.2f}", str(config["fallback_calls"])]
            rows.append(f"| {' | '.join(cells)} |")
    _assert_says(*rows)


def _reprefilled(config: dict[str, Any]) -> list[float]:
    """Per turn 1-7: its prompt and completion tokens less the next turn's cached."""
    t = config["turns"]
    return [
        t[i]["prompt_tokens"] + t[i]["completion_tokens"] - t[i + 1]["cached_tokens"]
        for i in range(len(t) - 1)
    ]


def test_reprefill_table() -> None:
    for agents in (1, 8):
        on = _reprefilled(_config(_zen4(agents, False), "on"))
        cells = [f"{np.mean(on):.1f}"]
        for jf in (False, True):
            got = _reprefilled(_config(_zen4(agents, jf), "on-structured"))
            cells.append(f"{np.mean(got):.1f} ({got[0]:.1f} after turn 1)")
        _assert_says(f"| {agents} | {' | '.join(cells)} |")


def _tool_turn_ratio(configs: dict[str, Any]) -> float:
    """Mean over the tool turns (1-7) of on-structured's e2e p50 over on's."""
    on, structured = _config(configs, "on"), _config(configs, "on-structured")
    pairs = list(zip(on["turns"][:-1], structured["turns"][:-1], strict=True))
    return float(np.mean([s["e2e_s_p50"] / o["e2e_s_p50"] for o, s in pairs]))


def test_zen4_jump_forward_prose() -> None:
    before1, jf1 = _zen4(1, False), _zen4(1, True)
    before8, jf8 = _zen4(8, False), _zen4(8, True)
    on_b, on_jf = _config(before1, "on")["turns"], _config(jf1, "on")["turns"]
    ttft = [b["ttft_s_p50"] / j["ttft_s_p50"] for b, j in zip(on_b, on_jf, strict=True)]
    e2e = [b["e2e_s_p50"] / j["e2e_s_p50"] for b, j in zip(on_b, on_jf, strict=True)]
    call = {
        jf: _config(c, "on-structured")["turns"][1]["completion_tokens"]
        for jf, c in ((False, before1), (True, jf1))
    }
    sessions = {
        jf: [_config(c, n)["session_wall_s_mean"] for n in ("on-structured", "on")]
        for jf, c in ((False, before1), (True, jf1))
    }
    _assert_says(
        f"turns' TTFT p50 {min(ttft):.1f}-{max(ttft):.1f}x and end-to-end p50 "
        f"{min(e2e):.1f}-{max(e2e):.1f}x shorter in this run",
        f"With it a call is {call[True]:.1f} tokens instead of {call[False]:.1f}",
        f"a tool turn's end-to-end time is {_tool_turn_ratio(jf1):.2f}x the `on` server's in "
        f"the same run (mean over the tool turns of the p50s' ratio; "
        f"{_tool_turn_ratio(jf8):.2f}x with 8 agents), against {_tool_turn_ratio(before1):.2f}x "
        f"({_tool_turn_ratio(before8):.2f}x) before",
        f"a session {sessions[True][0]:.1f} s against `on`'s {sessions[True][1]:.1f} s "
        f"({sessions[False][0]:.1f} s against {sessions[False][1]:.1f} s before)",
    )


def test_zen4_turn8_prose() -> None:
    before, jf = _zen4(1, False), _zen4(1, True)
    on, structured = _config(before, "on"), _config(before, "on-structured")
    on_jf, structured_jf = _config(jf, "on"), _config(jf, "on-structured")
    on_ratios = sorted(c["ttft_ratio_last_first_p50"] for c in (on, on_jf))
    first = [c["turns"][0] for c in (on, structured)]
    last = [c["turns"][-1] for c in (on, structured)]
    s1, s8 = structured["turns"][0], structured["turns"][-1]
    _assert_says(
        f"not met with one agent: {structured['ttft_ratio_last_first_p50']:.1f}x "
        f"({structured_jf['ttft_ratio_last_first_p50']:.1f}x with jump-forward; `on` "
        f"{on_ratios[0]:.1f}-{on_ratios[1]:.1f}x)",
        f"the user task ({min(t['new_tokens'] for t in first):.0f}-"
        f"{max(t['new_tokens'] for t in first):.0f} new tokens)",
        f"the previous call ({min(t['new_tokens'] for t in last):.0f}-"
        f"{max(t['new_tokens'] for t in last):.0f})",
        f"first runs: {first[0]['ttft_ms_per_new_token_p50']:.1f} and "
        f"{first[1]['ttft_ms_per_new_token_p50']:.1f} ms at turn 1, "
        f"{last[0]['ttft_ms_per_new_token_p50']:.1f} and "
        f"{last[1]['ttft_ms_per_new_token_p50']:.1f} ms at turn 8",
        f"({on['new_token_ratio_last_first']:.1f}x and "
        f"{structured['new_token_ratio_last_first']:.1f}x as many)",
        f"turn 1 queued {s1['queue_s_p50'] * 1000:.0f}, prefill {s1['prefill_s_p50'] * 1000:.0f}, "
        f"rest {s1['rest_s_p50'] * 1000:.0f}; turn 8 queued {s8['queue_s_p50'] * 1000:.0f}, "
        f"prefill {s8['prefill_s_p50'] * 1000:.0f}, rest {s8['rest_s_p50'] * 1000:.0f}",
    )


def test_zen5_table_and_prose() -> None:
    run = _results("agent_1agent.json")
    rows = []
    for name, config in run["configs"].items():
        hit = config["prefix_cache_hit_rate"]
        cells = [*_turn_cells(config), f"{hit:.2f}" if hit else "-"]
        rows.append(f"| {name.removeprefix('cache_').split('_agents_')[0]} | {' | '.join(cells)} |")
    structured = _config(run["configs"], "on-structured")
    s1, s8 = structured["turns"][0], structured["turns"][-1]
    rest = [t["rest_s_p50"] * 1000 for c in run["configs"].values() for t in c["turns"]]
    loads = [run["loadavg_start"][0], run["loadavg_end"][0]]
    _assert_says(
        *rows,
        f"load average {math.floor(min(loads))}-{math.ceil(max(loads))} (1 min) during the run",
        f"turn 1 queued {s1['queue_s_p50'] * 1000:.0f}, prefill {s1['prefill_s_p50'] * 1000:.0f}, "
        f"rest {s1['rest_s_p50'] * 1000:.0f}; turn 8 queued {s8['queue_s_p50'] * 1000:.0f}, "
        f"prefill {s8['prefill_s_p50'] * 1000:.0f}, rest {s8['rest_s_p50'] * 1000:.0f}",
        f"tokenizing and HTTP take {min(rest):.0f}-{max(rest):.0f} ms (all configurations)",
        f"1.5x of turn 1 is not met: {structured['ttft_ratio_last_first_p50']:.2f}x with "
        f"structured calls, {_config(run['configs'], 'on')['ttft_ratio_last_first_p50']:.2f}x "
        "without",
        f"the user task, {s1['new_tokens']:.0f} tokens",
        f"({_config(run['configs'], 'on')['turns'][-1]['new_tokens']:.0f} new tokens at turn 8 "
        f"instead of {s8['new_tokens']:.0f})",
    )


def test_prefill_context_prose() -> None:
    run = _results("prefill_context.json")
    by_new = run["by_new_tokens"]
    new = [r["new_tokens"] for r in by_new]
    cpu_ms = [r["cpu_s_p50_after_352"] * 1000 for r in by_new]
    slope, fixed = np.polyfit(new, cpu_ms, 1)
    structured = _config(_results("agent_1agent.json")["configs"], "on-structured")
    turns = structured["turns"]
    last, first = round(turns[-1]["new_tokens"]), round(turns[0]["new_tokens"])
    loads = [r["loadavg_1min"] for r in by_new]
    after = {r["context"]: r for r in run["results"]}
    _assert_says(
        f"{', '.join(str(n) for n in new[:-1])} and {new[-1]} new tokens take "
        f"{', '.join(f'{c:.0f}' for c in cpu_ms[:-1])} and {cpu_ms[-1]:.0f} ms of CPU",
        f"load average {math.floor(min(loads))}-{math.floor(max(loads))}), about {fixed:.0f} ms "
        f"plus {slope:.1f} ms a token (least squares), so turn 8's {last} new tokens cost about "
        f"{(fixed + slope * last) / (fixed + slope * first):.1f} times turn 1's {first} by that "
        f"fit ({fixed + slope * last:.0f} against {fixed + slope * first:.0f} ms), whatever else "
        f"is done (the {structured['ttft_ratio_last_first_p50']:.2f}x measured is within",
        f"128 new tokens after 1200 cached cost {after[1200]['cpu_ratio']:.2f}x the same tokens "
        "after none",
        "process: "
        + ", ".join(f"{after[c]['cpu_s_p50'] * 1000:.0f}" for c in sorted(after))
        + " ms",
    )


def test_zen4_runs_conditions() -> None:
    loads, commits = [], set()
    for agents in (1, 8):
        for jf in ("", "_jf"):
            run = _results(ZEN4.format(n=agents, jf=jf))
            loads += [run["loadavg_start"][0], run["loadavg_end"][0]]
            commits.add((jf, run["commit"].split()[0]))
    assert ("", "42babbf") in commits
    _assert_says(
        f"(the other core ran other jobs: load average {math.floor(min(loads))}-"
        f"{math.floor(max(loads))})",
        "First at commit 42babbf, before jump-forward decoding",
    )
