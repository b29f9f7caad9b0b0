"""docs/speculative_decoding.md's measured tables and step costs equal what
``benches/results/spec_decode_{quiet,policy,draft_model}.json`` hold, at the
precision printed."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PAGE = "docs/speculative_decoding.md"


def _results(name: str) -> Any:
    return json.loads((ROOT / "benches" / "results" / name).read_text())


def _assert_says(*figures: str) -> None:
    text = " ".join((ROOT / PAGE).read_text().split())  # runs of spaces as one
    missing = [f for f in (" ".join(f.split()) for f in figures) if f not in text]
    assert not missing, f"{PAGE} does not say {missing} (its results file does)"


def _quiet() -> dict[str, Any]:
    return {r["run"]: r for r in _results("spec_decode_quiet.json")["runs"]}


def _drafts(r: dict[str, Any], count: bool, length: str = ".2f") -> list[str]:
    """The draft cells (empty for off): draft tokens where ``count``,
    accepted, mean accepted length."""
    if r["method"] == "off":
        return [""] * (3 if count else 2)
    cells = [f"{r['num_draft_tokens']:,}"] if count else []
    return [*cells, f"{r['acceptance_rate']:.0%}", f"{r['mean_accepted_length']:{length}}"]


def _row(*cells: str) -> str:
    return f"| {' | '.join(cells)} |"


#: The SmolLM2 runs at 64 and 256 sequences, in the table's order, and each
#: run's label (its workload and the methods' order).
SMOL_RUNS = {
    "smol_g64": "grounded",
    "smol_256g": "grounded",
    "smol_256c": "chat",
    "smol_256c_order": "chat, ngram first",
    "smol_256g_rot": "grounded, off last",
}


def test_smollm2_quiet_table() -> None:
    rows = []
    for name, label in SMOL_RUNS.items():
        run = _quiet()[name]
        start, end = (run[k].split(",")[0] for k in ("load_average_start", "load_average_end"))
        for i, r in enumerate(run["results"]):
            head = f"{label} ({start} / {end})" if i == 0 else ""
            cells = [
                f"{r['wall_s']:.1f}",
                f"{r['output_tok_per_s']:.1f}",
                f"{r['tok_per_s_x_over_off']:.2f}",
                f"{r['tok_per_cpu_s_x_over_off']:.2f}",
                f"{r['tpot_off_over_x']:.2f}",
            ]
            rows.append(_row(head, str(r["sequences"]), r["method"], *cells, *_drafts(r, True)))
    _assert_says(*rows)


def test_gemma3_quiet_table() -> None:
    rows = []
    for name in ("gemma_g", "gemma_c"):
        for r in _quiet()[name]["results"]:
            cells = [
                r["workload"],
                str(r["sequences"]),
                r["method"],
                f"{r['tpot_ms']:.1f}",
                f"{r['tpot_off_over_x']:.2f}",
                f"{r['output_tok_per_s']:.1f}",
                f"{r['tok_per_s_x_over_off']:.2f}",
                f"{r['tok_per_cpu_s_x_over_off']:.2f}",
            ]
            assert r["identical_to_off"]
            rows.append(_row(*cells, *_drafts(r, False), "yes"))
    _assert_says(*rows)


def _ms(seconds: float) -> str:
    """Milliseconds to 3 significant digits, trailing zeros kept (``30.0``)."""
    return f"{seconds * 1000:#.3g}".rstrip(".")


def _costs(run: dict[str, Any]) -> str:
    """Start-up step costs: ``N: decode ms / draft ms (share)``, the share a
    batch's drafts over its decode step (``N x draft / decode``, at most 1)."""
    return "; ".join(
        f"{n}: {_ms(decode)} / {_ms(draft)} ({min(1.0, n * draft / decode):.2f})"
        for n, decode, draft in run["draft_step_costs"]
    )


def test_step_costs() -> None:
    quiet = _quiet()
    _assert_says(
        f"the 64-sequence run: {_costs(quiet['smol_g64'])}; "
        f"the first 256-sequence run: {_costs(quiet['smol_256g'])}.",
        f"the grounded run: {_costs(quiet['gemma_g'])}; the chat run: {_costs(quiet['gemma_c'])}.",
    )
    last = quiet["smol_256g_rot"]["draft_step_costs"]
    *small, (n, decode, draft) = last
    assert n == 256
    _assert_says(
        f"measured decode {decode * 1000:,.0f} ms and a draft {_ms(draft)} ms at 256 "
        f"sequences, share {n * draft / decode:.2f}",
        f"the other points of this run are also slower: {_costs({'draft_step_costs': small})})",
    )


def test_policy_table() -> None:
    run = _results("spec_decode_policy.json")["runs"][0]  # one sequence
    assert {r["sequences"] for r in run["results"]} == {1}
    rows = []
    for r in run["results"]:
        cells = [
            r["method"],
            f"{r['tpot_ms']:.1f}",
            f"{r['tpot_off_over_x']:.2f}",
            f"{r['output_tok_per_s']:.1f}",
            f"{r['tok_per_s_x_over_off']:.2f}",
        ]
        rows.append(_row(*cells, *_drafts(r, False, ".1f")))
    ((n, decode, draft),) = run["draft_step_costs"]
    _assert_says(
        *rows,
        f"decode {decode * 1000:.0f} ms, a draft {draft * 1000:.0f} ms "
        f"(share {n * draft / decode:.2f})",
    )


def test_draft_model_table() -> None:
    runs = _results("spec_decode_draft_model.json")["runs"]
    rows = []
    for i, first in enumerate(runs[0]["results"]):
        same = [run["results"][i] for run in runs]
        assert all(
            (r["workload"], r["method"]) == (first["workload"], first["method"]) for r in same
        )
        tpot = [r["tpot_ms"] for r in same]
        if first["method"] == "off":
            accepted = "- | -"
        else:
            drafted, took = first["num_draft_tokens"], first["num_accepted_tokens"]
            accepted = (
                f"{took / drafted:.3f} ({took}/{drafted}) | {first['mean_accepted_length']:.2f}"
            )
        assert all(r["identical_to_off"] for r in same)
        rows.append(
            f"| {first['workload']} | {first['method']} | {accepted} | "
            f"{' / '.join(f'{t:.0f}' for t in tpot)} | {statistics.median(tpot):.0f} | yes |"
        )
    _assert_says(*rows)


def _spec(run: str) -> list[dict[str, Any]]:
    return [r for r in _quiet()[run]["results"] if r["method"] != "off"]


def _off(run: str) -> dict[str, Any]:
    (off,) = (r for r in _quiet()[run]["results"] if r["method"] == "off")
    return off


def _span(values: list[float], fmt: str, unit: str = "", scale: float = 1) -> str:
    lo, hi = min(values) * scale, max(values) * scale
    return f"{lo:{fmt}}{unit}-{hi:{fmt}}{unit}"


def test_smollm2_quiet_prose() -> None:
    g64 = {r["method"]: r for r in _spec("smol_g64")}
    at256 = _spec("smol_256g") + _spec("smol_256c")
    rot = {r["method"]: r for r in _spec("smol_256g_rot")}
    chat_first, chat_second = _off("smol_256c"), _off("smol_256c_order")
    grounded_first, grounded_last = _off("smol_256g"), _off("smol_256g_rot")
    rates = [r["acceptance_rate"] * 100 for r in g64.values()]
    level = [
        r[k] for r in g64.values() for k in ("tok_per_s_x_over_off", "tok_per_cpu_s_x_over_off")
    ]
    off64 = _off("smol_g64")
    lower = [(1 - r["tpot_ms"] / off64["tpot_ms"]) * 100 for r in g64.values()]
    (share64,) = (64 * dr / d for n, d, dr in _quiet()["smol_g64"]["draft_step_costs"] if n == 64)
    _assert_says(
        f"most proposals are accepted ({_span(rates, '.0f')}%), just below the measured share "
        f"of a draft at this batch ({share64:.2f})",
        f"and {round(off64['output_tokens'], -2):,} output tokens",
        f"the mean accepted length is "
        f"{_span([r['mean_accepted_length'] for r in g64.values()], '.1f')}, "
        f"TPOT is {_span(lower, '.0f')}% lower",
        f"{g64['suffix']['num_draft_tokens']:,} (suffix) and {g64['ngram']['num_draft_tokens']:,} "
        "(ngram) draft rows",
        f"throughput equal to off ({_span(level, '.2f')} on wall and CPU time)",
        f"the speculating engines drafted {_span([r['num_draft_tokens'] for r in at256], 'd')} "
        "tokens",
        f"slower than off: {_span([r['tok_per_s_x_over_off'] for r in at256], '.2f')}x its "
        f"tokens/s ({_span([r['tok_per_cpu_s_x_over_off'] for r in at256], '.2f')}x per CPU "
        "second)",
        f"off, run second, took {chat_second['wall_s']:.1f} s where it took "
        f"{chat_first['wall_s']:.1f} s run first "
        f"({chat_second['wall_s'] / chat_first['wall_s'] - 1:.0%} more; grounded, off run last "
        f"took {grounded_last['wall_s']:.1f} s against {grounded_first['wall_s']:.1f} s run "
        f"first, {grounded_last['wall_s'] / grounded_first['wall_s'] - 1:.0%} more)",
        f"{rot['suffix']['num_draft_tokens']:,} (suffix) and {rot['ngram']['num_draft_tokens']:,} "
        "(ngram) draft rows",
        f"{_span([r['acceptance_rate'] * 100 for r in rot.values()], '.0f')}% accepted",
        f"tokens/s {rot['suffix']['tok_per_s_x_over_off']:.2f}x (suffix) and "
        f"{rot['ngram']['tok_per_s_x_over_off']:.2f}x (ngram) of off "
        f"({rot['suffix']['tok_per_cpu_s_x_over_off']:.2f}x and "
        f"{rot['ngram']['tok_per_cpu_s_x_over_off']:.2f}x on CPU time)",
    )


def test_gemma3_quiet_prose() -> None:
    spec = _spec("gemma_g") + _spec("gemma_c")

    def rows(workload: str, sizes: set[int]) -> list[dict[str, Any]]:
        return [r for r in spec if r["workload"] == workload and r["sequences"] in sizes]

    mid, one = rows("grounded", {4, 16}), {r["method"]: r for r in rows("grounded", {1})}
    chat1, chat4 = rows("chat", {1}), rows("chat", {4})
    at64 = rows("grounded", {64}) + rows("chat", {64})
    costs = {n: (d, dr) for n, d, dr in _quiet()["gemma_g"]["draft_step_costs"]}
    shares = [
        min(1.0, 64 * dr / d)
        for run in ("gemma_g", "gemma_c")
        for n, d, dr in _quiet()[run]["draft_step_costs"]
        if n == 64
    ]

    def pct(rs: list[dict[str, Any]]) -> str:
        return _span([r["acceptance_rate"] * 100 for r in rs], ".0f") + "%"

    def ratios(rs: list[dict[str, Any]], key: str, fmt: str = ".2f") -> str:
        return _span([r[key] for r in rs], fmt)

    _assert_says(
        f"TPOT is {ratios(mid, 'tpot_off_over_x', '.1f')}x lower with ngram and suffix at 4 and 16 "
        f"sequences, where {pct(mid)} of the drafts are accepted, and tokens/s moves much less "
        f"({ratios(mid, 'tok_per_s_x_over_off')}x)",
        f"({pct(list(one.values()))} accepted, {one['ngram']['num_draft_tokens']} and "
        f"{one['suffix']['num_draft_tokens']} draft tokens)",
        f"so on chat {pct(chat1 + chat4)} of the drafts are accepted too",
        f"four sequences {ratios(chat4, 'tok_per_s_x_over_off')}x (TPOT "
        f"{ratios(chat4, 'tpot_off_over_x', '.1f')}x lower)",
        f"At 64 sequences the share of a draft is {_span(shares, '.2f')} and ngram's and suffix's "
        f"rates ({pct(at64)}) are near it: TPOT is",
        f"(off / x {ratios(at64, 'tpot_off_over_x')})",
        f"{ratios(at64, 'tok_per_s_x_over_off')}x its tokens/s on both workloads "
        f"({_span([r['num_draft_tokens'] for r in at64], ',d')} draft rows",
        f"decode ms per sequence: {costs[64][0] * 1000 / 64:.1f} at 64, "
        f"{costs[16][0] * 1000 / 16:.0f} at 16",
    )
    fast = sorted(r["tok_per_s_x_over_off"] for r in chat1)
    _assert_says(
        f"one sequence runs {fast[0]:.1f}-{fast[-1]:.2f}x faster (TPOT "
        f"{ratios(chat1, 'tpot_off_over_x', '.1f')}x lower)"
    )


def test_start_up_shares_and_draft_model_prose() -> None:
    def one_seq_shares(names: list[str]) -> list[float]:
        return [
            dr / d for name in names for n, d, dr in _quiet()[name]["draft_step_costs"] if n == 1
        ]

    smol = one_seq_shares(list(SMOL_RUNS))
    gemma = one_seq_shares(["gemma_g", "gemma_c"])
    draft = _results("spec_decode_draft_model.json")
    first = {(r["workload"], r["method"]): r for r in draft["runs"][0]["results"]}
    self_ = [r for k, r in first.items() if k[1] == "draft_self"]
    tiny = [first[("grounded", "draft_tiny")], first[("chat", "draft_tiny")]]
    chat_self = [run["results"] for run in draft["runs"]]
    tpot = [
        r["tpot_ms"]
        for results in chat_self
        for r in results
        if (r["workload"], r["method"]) == ("chat", "draft_self")
    ]
    assert {(r["num_accepted_tokens"], r["num_draft_tokens"]) for r in self_} == {(47, 47)}
    _assert_says(
        f"the share at one sequence is {_span(smol, '.2f')} with SmolLM2 (the five runs' start-up "
        f"measurements in `spec_decode_quiet.json`) and {_span(gemma, '.2f')} with Gemma 3",
        f"{tiny[0]['num_accepted_tokens']} of {tiny[0]['num_draft_tokens']} and "
        f"{tiny[1]['num_accepted_tokens']} of {tiny[1]['num_draft_tokens']} with the random draft",
        f"average {draft['load_average'].split(' ')[0]} during the runs",
        f"varies up to {max(tpot) / min(tpot):.0f}x between runs (chat, draft_self: "
        f"{max(tpot):.0f} and {min(tpot):.0f} ms)",
    )


def _model_s(run: str, results: list[dict[str, Any]], n: int) -> list[float]:
    """The cost model's time of each result's draft rows: its draft tokens times
    the run's start-up draft cost at ``n`` sequences, in s."""
    (draft,) = (dr for m, _, dr in _quiet()[run]["draft_step_costs"] if m == n)
    return [r["num_draft_tokens"] * draft for r in results]


def test_smollm2_256_prose() -> None:
    """The 256-sequence runs' wall time against off, the cost model's bound on
    their drafts, the runs in other orders and the seven comparisons."""
    first = {run: _spec(run) for run in ("smol_256g", "smol_256c")}
    more = [r["wall_s"] - _off(run)["wall_s"] for run, rs in first.items() for r in rs]
    model = [s for run, rs in first.items() for s in _model_s(run, rs, 256)]
    (n, decode, draft) = _quiet()["smol_256g"]["draft_step_costs"][-1]
    assert n == 256
    (ngram_first,) = _spec("smol_256c_order")
    rot = _spec("smol_256g_rot")
    higher = [(1 / r["tpot_off_over_x"] - 1) * 100 for r in rot]
    assert (
        len({f"{h:.0f} {r['tpot_off_over_x']:.2f}" for h, r in zip(higher, rot, strict=True)}) == 1
    )  # one figure for both
    seven = [*first["smol_256g"], *first["smol_256c"], ngram_first, *rot]
    near = [r for r in seven if abs(r["tok_per_s_x_over_off"] - 1) <= 0.03]
    assert near == [ngram_first] and len(seven) == 7
    others = [r["tok_per_s_x_over_off"] for r in seven if r is not ngram_first]
    _assert_says(
        f"rows are at most {max(model):.1f} s of model time by the cost model, against "
        f"{_span(more, '.0f')} s more wall time than off",
        f"the same chat batch gives ngram {ngram_first['tok_per_s_x_over_off']:.2f}x of off on "
        f"wall time and {ngram_first['tok_per_cpu_s_x_over_off']:.2f}x on CPU time, TPOT "
        f"{ngram_first['tpot_off_over_x']:.2f}x",
        f"(the first grounded run: {decode * 1000:.0f} ms, {_ms(draft)} ms, share "
        f"{min(1.0, n * draft / decode):.2f};",
        f"TPOT {higher[0]:.0f}% higher (off / x {rot[0]['tpot_off_over_x']:.2f})",
        f"within 3% of off (ngram on chat, run before off: "
        f"{ngram_first['tok_per_s_x_over_off']:.2f}x); the other six are "
        f"{_span(others, '.2f')}x",
    )


def test_gemma3_64_and_load_prose() -> None:
    """Gemma 3 at 64 sequences: TPOT against off, the draft rows' cost by the
    start-up draft costs; one sequence within a bound of off; the runs' load
    averages (the first of each ``/proc/loadavg`` triple)."""
    quiet = _quiet()
    at64 = {run: [r for r in _spec(run) if r["sequences"] == 64] for run in ("gemma_g", "gemma_c")}
    tpot = [r["tpot_off_over_x"] for rs in at64.values() for r in rs]
    drafts = [dr for run in at64 for n, _, dr in quiet[run]["draft_step_costs"] if n == 64]
    model = [s for run, rs in at64.items() for s in _model_s(run, rs, 64)]
    one = [r for r in _spec("gemma_g") if r["sequences"] == 1]
    apart = max(abs(1 - r[k]) for r in one for k in ("tok_per_s_x_over_off", "tpot_off_over_x"))
    load = {run: (quiet[run]["load_average_start"], quiet[run]["load_average_end"]) for run in at64}
    first = {run: [s.split(",")[0] for s in pair] for run, pair in load.items()}
    _assert_says(
        f"TPOT is {(1 / min(tpot) - 1) * 100:.0f}% higher to {(1 - 1 / max(tpot)) * 100:.0f}% "
        f"lower (off / x {_span(tpot, '.2f')})",
        f"rows at {_span(drafts, '.1f', '', 1000)} ms, {_span(model, '.1f')} s by the cost model",
        f"the methods are within {math.ceil(apart * 100)}% of off",
        f"Load average {first['gemma_g'][0]} at the start of the grounded run, "
        f"{first['gemma_g'][1]} at its end; {first['gemma_c'][0]} and {first['gemma_c'][1]} for "
        "the chat run.",
    )
