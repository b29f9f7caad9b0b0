"""docs/quantization-figures.md's measured tables equal what their
``benches/results/*.json`` hold, at the precision printed: the first-token
load times (against llama.cpp, with and without the skeleton and config
caches), the accuracy against HF, and pagedrs against llama.cpp on the Zen 5
class CPU and on the Xeon (AMX): speeds against issue 41's goals and loads to
the first token."""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "quantization-figures.md"
GIB = 1 << 30


def _results(name: str) -> Any:
    return json.loads((ROOT / "benches" / "results" / name).read_text())


def _table(header: str) -> list[list[str]]:
    """The rows (cells stripped) of the page's table under ``header``."""
    lines = PAGE.read_text().splitlines()
    start = lines.index(header) + 2
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    assert rows, f"no table under {header!r}"
    return rows


def _assert_rows(header: str, want: list[list[str]]) -> None:
    got = _table(header)
    assert got == want, f"docs/quantization-figures.md's table {header!r} differs from its JSON"


#: bench model key -> the page's name of its file.
LABELS = {
    "smollm2": "SmolLM2-135M Q4_1",
    "gemma3": "Gemma 3 270M Q4_K_M",
    "1b": "Llama-3.2-1B-shaped Q4_0",
    "8b": "Llama-3.1-8B-shaped Q4_0",
}


def test_first_token_table() -> None:
    run = _results("gguf_load_first_token_xeon-amx_2026-12-06.json")
    want = []
    for key, m in run["models"].items():
        for load in ("first", "second"):
            before, after = m[f"base.{load}"], m[f"this.{load}"]
            cells = [
                f"{r['first_token_seconds']:.2f} ({r['first_token_cpu_seconds']:.2f})"
                for r in (before, after)
            ]
            label = f"{LABELS[key]} ({m['file_bytes'] / 1e9:.2f} GB)"
            want.append([label, load, *cells, f"{after['after_load']['VmHWM'] / 1e9:.2f}"])
    _assert_rows(
        "| model file | load | before: s to first token (CPU s) | after: s to first token "
        "(CPU s) | after: peak RSS GB |",
        want,
    )


SPM_HEADER = (
    "| model file | load | main: s to first token (CPU s) | this: s to first token (CPU s) "
    "| llama.cpp: s to first token (CPU s) | main / llama.cpp | this / llama.cpp |"
)


def test_spm_tokenizer_load_table() -> None:
    """Gemma's tokenizer written from the metadata: main, this tree and
    llama.cpp in one run, the ratios over llama.cpp's CPU seconds to the
    first token."""
    run = _results("gguf_load_spm_epyc-zen5_2026-12-06.json")
    want = []
    for key, m in run["models"].items():
        for load in ("first", "second"):
            main, this, peer = (m[f"{e}.{load}"] for e in ("main", "this", "llama.cpp"))
            cells = [
                f"{r['first_token_seconds']:.2f} ({r['first_token_cpu_seconds']:.2f})"
                for r in (main, this, peer)
            ]
            ratios = [
                f"{r['first_token_cpu_seconds'] / peer['first_token_cpu_seconds']:.2f}x"
                for r in (main, this)
            ]
            want.append([f"{LABELS[key]} ({m['file_bytes'] / 1e9:.2f} GB)", load, *cells, *ratios])
    _assert_rows(SPM_HEADER, want)


def _quality(m: dict[str, Any]) -> list[str]:
    return [
        f"{m['positions']:,}",
        f"{m['mean_abs_dlogprob']:.5f}",
        f"{m['max_abs_dlogprob']:.4f}",
        f"{m['greedy_agreement']:.4f}",
    ]


INT8 = 'SmolLM2-135M, `quantization="int8"`'
GGUF_NAMES = {"smollm2": "SmolLM2-135M Q4_1 GGUF", "gemma3": "Gemma 3 270M Q4_K_M GGUF"}


def test_accuracy_against_hf_table() -> None:
    models = _results("quant_vs_hf_2026-12-03.json")["models"]
    same = "HF, same GGUF dequantized"
    want = [[GGUF_NAMES[k], same, *_quality(models[k])] for k in ("smollm2", "gemma3")]
    want.append([INT8, "HF, same int8 weights dequantized", *_quality(models["int8"])])
    want.append([INT8, "HF, the float checkpoint", *_quality(models["int8"]["vs_float"])])
    _assert_rows(
        "| model | reference | positions | mean abs dlogprob | max abs dlogprob | "
        "greedy agreement |",
        want,
    )


def test_int8_activations_accuracy_table() -> None:
    models = _results("quant_vs_hf_int8_zen4_2026-12-05.json")["models"]
    engines = {
        "int16": "pagedrs, int16 activations",
        "int8": "pagedrs, int8 activations",
        "llama.cpp": "llama.cpp",
    }
    want = []
    for key, name in (*GGUF_NAMES.items(), ("int8", INT8)):
        for engine, label in engines.items():
            if engine in models[key]:
                want.append([name, label, *_quality(models[key][engine])])
    _assert_rows(
        "| model | engine | positions | mean abs dlogprob | max abs dlogprob | greedy agreement |",
        want,
    )


ZEN5 = {
    "smollm2": ["quantized_zen5_smollm2_2026-12-03b.json"],
    "gemma3": ["quantized_zen5_gemma3_2026-12-03b.json"],
    "1b": ["quantized_zen5_1b_2026-12-03b.json", "quantized_zen5_1b_256_prefill_2026-12-03b.json"],
    "8b": ["quantized_zen5_8b_2026-12-03b.json"],
}


def _zen5_measures(key: str) -> dict[str, tuple[float, float]]:
    """Each measure the runs of ``key`` hold: (pagedrs, llama.cpp)."""
    out: dict[str, tuple[float, float]] = {}
    for name in ZEN5[key]:
        (m,) = _results(name)["models"].values()
        p, c = m["pagedrs"], m["llama.cpp"]
        for n in p["decode"]:
            out[f"decode {n}"] = (p["decode"][n]["tok_s"], c["decode"][n]["tok_s"])
        if "prefill" in p:
            out["prefill"] = (p["prefill"]["tok_s"], c["prefill"]["tok_s"])
        bound = (1.25 * m["file_bytes"] + GIB + p["kv_bytes"]) / GIB
        out[f"rss {bound:.2f}"] = (p["end"]["VmHWM"] / GIB, c["end"]["VmHWM"] / GIB)
    return out


def _measure_key(measure: str) -> str:
    if m := re.match(r"(\d+) sequences?", measure):
        return f"decode {m.group(1)}"
    if measure.startswith("prefill"):
        return "prefill"
    m = re.match(r"peak RSS, GiB \(bound ([\d.]+)\)", measure)
    assert m, f"unknown measure {measure!r}"
    return f"rss {m.group(1)}"


def test_zen5_llama_cpp_table() -> None:
    rows = _table("| model file | measure | pagedrs | llama.cpp | ratio |")
    names = {v: k for k, v in LABELS.items()}
    measures = {k: _zen5_measures(k) for k in ZEN5}
    for label, measure, mine, peer, ratio in rows:
        p, c = measures[names[label]][_measure_key(measure)]
        assert [mine, peer, ratio] == [f"{p:.2f}", f"{c:.2f}", f"{p / c:.2f}x"], (label, measure)
    assert len(rows) == sum(len(m) for m in measures.values())


@pytest.mark.parametrize("key", list(ZEN5))
def test_zen5_runs_name_their_cpu(key: str) -> None:
    for name in ZEN5[key]:
        assert _results(name)["cpu"].startswith("AMD EPYC (family 26 model 2")


def test_load_table() -> None:
    """Load times: "before" one run, pagedrs and llama.cpp the median of each
    column over their three runs; the bound ``1.25 x file + 1 GiB``."""
    runs = _results("gguf_load_2026-12-03.json")["runs"]
    want = []
    for key, label in LABELS.items():
        first = runs["small"][key] if "seconds" in runs["small"][key]["this"] else runs["8b"][key]
        file_gb, bound = first["file_bytes"] / 1e9, (1.25 * first["file_bytes"] + GIB) / 1e9
        mine = [first["this"], runs["repeat2"][key]["pagedrs"], runs["repeat3"][key]["pagedrs"]]
        peer = [runs[r][key]["llama.cpp"] for r in ("llama.cpp", "repeat2", "repeat3")]

        def cells(group: list[dict[str, Any]]) -> list[str]:
            def mid(f: Any) -> float:
                return float(statistics.median(f(r) for r in group))

            return [
                f"{mid(lambda r: r['seconds']):.1f}",
                f"{mid(lambda r: r['cpu_seconds']):.1f}",
                f"{mid(lambda r: r['after_load']['VmHWM']) / 1e9:.2f}",
            ]

        name = f"{label} ({file_gb:.2f} GB)"
        want.append(
            [name, "pagedrs before (09695e0), 1 run", *cells([first["base"]]), f"{bound:.2f}"]
        )
        want.append([name, "pagedrs, median of 3", *cells(mine), f"{bound:.2f}"])
        want.append([name, "llama.cpp, median of 3", *cells(peer), ""])
    _assert_rows("| model file (size) | engine | wall s | CPU s | peak RSS GB | bound GB |", want)


def _per_cpu_s(run: dict[str, Any], kind: str, n: str | None, tokens: int) -> float:
    r = run[kind] if n is None else run[kind][n]
    return float(tokens / r["cpu_seconds"])


def test_int8_activations_speed_table() -> None:
    """Output (prefill: prompt) tokens per CPU second of each engine's process."""
    int8 = _results("quantized_int8_vs_llamacpp_zen4_2026-12-05.json")
    int16 = _results("quantized_int16_zen4_2026-12-05.json")
    want = []
    for key in ("1b", "gemma3"):
        m8, m16 = int8["models"][key], int16["models"][key]
        out = m8["output_tokens"]
        measures: list[tuple[str, str, str | None, int]] = [
            (f"{n} sequence{'s' if n != '1' else ''}", "decode", n, int(n) * out)
            for n in sorted(m8["pagedrs"]["decode"], key=int)
        ]
        prefill = int8["prefill_tokens"]
        measures.append((f"prefill {prefill:,}", "prefill", None, prefill))
        for label, kind, n, tokens in measures:
            a, b = (_per_cpu_s(m["pagedrs"], kind, n, tokens) for m in (m16, m8))
            c = _per_cpu_s(m8["llama.cpp"], kind, n, tokens)
            cells = [f"{a:.2f}", f"{b:.2f}", f"{c:.2f}", f"{b / a:.2f}x", f"{b / c:.2f}x"]
            want.append([LABELS[key], label, *cells])
    _assert_rows(
        "| file | measure | pagedrs int16 | pagedrs int8 | llama.cpp | int8 / int16 | "
        "int8 / llama.cpp |",
        want,
    )


def test_zen4_8b_tables_and_prefill() -> None:
    """The 8B-shaped file on the Zen 4 class CPU: tokens/s, peak RSS against
    the bound ``1.25 x file + 1 GiB + KV``, and the prefill run."""
    runs = [
        _results(f"quantized_zen4_8b{part}_2026-12-04.json")["models"]["8b"]
        for part in ("", "_256", "_prefill")
    ]
    speed, rss = [], []
    for m in runs[:2]:
        p, c = m["pagedrs"], m["llama.cpp"]
        bound = (1.25 * m["file_bytes"] + GIB + p["kv_bytes"]) / GIB
        for n in sorted(p["decode"], key=int):
            a, b = p["decode"][n]["tok_s"], c["decode"][n]["tok_s"]
            speed.append([n, f"{a:.2f}", f"{b:.2f}", f"{a / b:.2f}x"])
            if n != "16":
                ha, hb = (e["decode"][n]["vmhwm"] / GIB for e in (p, c))
                through = f"{n} sequence{'s' if n != '1' else ''}"
                rss.append([through, f"{ha:.2f}", f"{hb:.2f}", f"{ha / hb:.2f}x", f"{bound:.2f}"])
    _assert_rows("| sequences | pagedrs tok/s | llama.cpp tok/s | ratio |", speed)
    _assert_rows("| through | pagedrs GiB | llama.cpp GiB | ratio | pagedrs bound GiB |", rss)
    m = runs[2]
    p, c = m["pagedrs"], m["llama.cpp"]
    bound = (1.25 * m["file_bytes"] + GIB + p["kv_bytes"]) / GIB
    peak, peer = p["end"]["VmHWM"] / GIB, c["end"]["VmHWM"] / GIB
    kv = [r["pagedrs"]["kv_bytes"] / GIB for r in runs[:2]]
    said = [
        f"pagedrs {p['prefill']['tok_s']:.2f} prompt tokens/s ({p['prefill']['seconds']:.1f} s), "
        f"llama.cpp {c['prefill']['tok_s']:.2f} ({c['prefill']['seconds']:.1f} s), "
        f"{p['prefill']['tok_s'] / c['prefill']['tok_s']:.2f}x; peak RSS through the prefill "
        f"{peak:.2f} GiB against llama.cpp's {peer:.2f} ({peak / peer:.2f}x), within the bound "
        f"of {bound:.2f} GiB (the KV cache given: {p['kv_bytes'] / GIB:.2f} GiB)",
        f"({kv[0]:.2f} GiB for 1-64 sequences, {kv[1]:.2f} GiB for 256)",
    ]
    text = " ".join(PAGE.read_text().split())
    missing = [s for s in said if s not in text]
    assert not missing, f"docs/quantization-figures.md does not say {missing}"


def _moe_rows(name: str, peer: str | None = None) -> list[list[str]]:
    """The rows of a mixture-of-experts speed table from bench_quantized's
    JSON (llama.cpp's figures from the JSON ``peer`` when given: a run of
    pagedrs alone)."""
    (m,) = _results(name)["models"].values()
    (other,) = _results(peer or name)["models"].values()
    p, c = m["pagedrs"]["decode"], other["llama.cpp"]["decode"]
    want = []
    for n in sorted(p, key=int):
        tokens = int(n) * m["output_tokens"]
        a, b = p[n]["tok_s"], c[n]["tok_s"]
        ca, cb = tokens / p[n]["cpu_seconds"], tokens / c[n]["cpu_seconds"]
        want.append(
            [
                n,
                f"{a:.2f}",
                f"{b:.2f}",
                f"{a / b:.2f}x",
                f"{ca:.1f}",
                f"{cb:.1f}",
                f"{ca / cb:.2f}x",
            ]
        )
    return want


@pytest.mark.parametrize(
    ("name", "first"),
    [
        ("quantized_moe_epyc-zen5_2026-12-06.json", "sequences"),
        ("quantized_moe_loop_epyc-zen5_2026-12-06.json", "sequences (per-expert loop)"),
        ("quantized_moe_native_epyc-zen5_2026-12-07.json", "sequences (native layers)"),
        (
            "quantized_gemma3_all_panels_epyc-zen5_2026-12-07.json",
            "sequences (every projection in panels)",
        ),
        ("quantized_30b_a3b_epyc-zen5_2026-12-06.json", "sequences (30B-A3B)"),
    ],
)
def test_moe_table(name: str, first: str) -> None:
    _assert_rows(
        f"| {first} | pagedrs tok/s | llama.cpp tok/s | ratio | pagedrs tok/CPU-s | "
        "llama.cpp tok/CPU-s | ratio |",
        _moe_rows(name),
    )


def test_moe_30b_one_call_table() -> None:
    """The 30B-A3B shape with the experts in one call, pagedrs alone, against
    llama.cpp's figures of the earlier run."""
    _assert_rows(
        "| sequences (30B-A3B, experts in one call) | pagedrs tok/s | llama.cpp tok/s "
        "(earlier run) | ratio | pagedrs tok/CPU-s | llama.cpp tok/CPU-s (earlier run) | ratio |",
        _moe_rows(
            "quantized_30b_a3b_one_call_epyc-zen5_2026-12-06.json",
            "quantized_30b_a3b_epyc-zen5_2026-12-06.json",
        ),
    )


def test_moe_30b_memory_prose() -> None:
    (m,) = _results("quantized_30b_a3b_epyc-zen5_2026-12-06.json")["models"].values()
    said = [
        f"{m['pagedrs']['end']['VmHWM'] / GIB:.2f} GiB",
        f"{m['llama.cpp']['end']['VmHWM'] / GIB:.2f} GiB",
        f"{m['file_bytes'] / 1e9:.2f} GB",
    ]
    missing = [x for x in said if x not in PAGE.read_text()]
    assert not missing, f"docs/quantization-figures.md does not say {missing}"


def test_one_row_kernel_and_one_sequence_tables() -> None:
    kernel = _results("quant_kernel_zen4_1row_2026-12-04.json")["results"]
    rows = _table("| kernel, 1 row (ms, best of 2 rounds) | 42babbf | this code | speed-up |")
    for label, before, after, speedup in rows:
        r = kernel[f"{label.split(' (')[0].replace(' x ', 'x')} rows=1"]

        def ms(v: float) -> str:
            return f"{v:.3f}" if v < 10 else f"{v:.2f}"

        assert [before, after, speedup] == [
            ms(r["before_ms"]),
            ms(r["after_ms"]),
            f"{r['speedup']:.2f}x",
        ], label
    runs = {
        k: _results(f"quantized_zen4_1seq_{k}_2026-12-04.json")["models"]
        for k in ("before", "after", "llamacpp")
    }
    want = []
    for key in ("1b", "gemma3", "smollm2"):
        a, b = (runs[k][key]["pagedrs"]["decode"]["1"]["tok_s"] for k in ("before", "after"))
        want.append([LABELS[key], f"{a:.2f}", f"{b:.2f}", f"{b / a:.2f}x"])
    _assert_rows(
        "| one sequence, tok/s (16-token prompt, 16 outputs) | 42babbf | this code | speed-up |",
        want,
    )
    peer = {
        k: runs["llamacpp"][k]["llama.cpp"]["decode"]["1"]["tok_s"] for k in LABELS if k != "8b"
    }
    mine = {k: runs["after"][k]["pagedrs"]["decode"]["1"]["tok_s"] for k in peer}
    ratios = [f"{mine[k] / peer[k]:.2f}x" for k in ("1b", "gemma3", "smollm2")]
    said = (
        f"{peer['1b']:.2f} tok/s on the 1B shape, {peer['gemma3']:.2f} on Gemma 3 and "
        f"{peer['smollm2']:.2f} on SmolLM2, so at one sequence pagedrs makes "
        f"{ratios[0]}, {ratios[1]} and {ratios[2]} llama.cpp's tokens"
    )
    assert said in " ".join(PAGE.read_text().split())


def test_panels_tables() -> None:
    """Every row of the three "main" against "panels" kernel tables (the
    float32 and bfloat16 figures of the panels run)."""

    def figures(name: str) -> dict[tuple[int, int, int, str], dict[str, Any]]:
        run = _results(name)["figures"]
        return {(f["n"], f["k"], f["rows"], f["format"]): f for f in run}

    main = figures("quant_linear_zen5_main_2026-12-03.json")
    panels = figures("quant_linear_zen5_panels_2026-12-03.json")
    header = (
        "| shape (N x K) | rows | format | main ms | panels ms | speed-up | float32 ms | "
        "bfloat16 ms | panels x bfloat16 |"
    )
    lines = PAGE.read_text().splitlines()
    starts = [i + 2 for i, line in enumerate(lines) if line == header]
    assert len(starts) == 3
    checked = 0
    for start in starts:
        for line in lines[start:]:
            if not line.startswith("|"):
                break
            shape, rows, fmt, *cells = (c.strip() for c in line.strip().strip("|").split("|"))
            n, k = (int(x) for x in shape.split(" x "))
            m, p = main[(n, k, int(rows), fmt)], panels[(n, k, int(rows), fmt)]
            want = [
                f"{m['ms']:.2f}",
                f"{p['ms']:.2f}",
                f"{m['ms'] / p['ms']:.2f}x",
                f"{p['f32_ms']:.2f}",
                f"{p['bf16_ms']:.2f}",
                f"{p['speedup_vs_bf16']:.2f}x",
            ]
            assert cells == want, line
            checked += 1
    assert checked >= 24


#: Issue 41's speed goals (pagedrs over llama.cpp) per measure.
GOALS = {"1": 1.2, "16": 2.0, "64": 3.0, "256": 3.0, "prefill": 2.0}


def _goal(x: float) -> str:
    return f"{x:g}x"


def _goal_measures() -> Iterator[tuple[Any, str, Any, Any, float]]:
    """(model run, the page's measure name, pagedrs' and llama.cpp's figures,
    goal) of each of issue 41's goals on the Xeon's 1B and Gemma 3 runs."""
    for name in ("1b", "gemma3"):
        m = _results(f"quantized_{name}_xeon-amx_2026-12-06.json")["models"][name]
        for key, goal in GOALS.items():
            if key == "prefill":
                ours, peer = m["pagedrs"]["prefill"], m["llama.cpp"]["prefill"]
                measure = f"prefill {ours['tokens']:,}"
            else:
                ours, peer = m["pagedrs"]["decode"][key], m["llama.cpp"]["decode"][key]
                measure = f"{key} sequence" + ("" if key == "1" else "s")
            yield m, measure, ours, peer, goal


def test_issue_41_goals_table_xeon() -> None:
    want = []
    for m, measure, ours, peer, goal in _goal_measures():
        ratio = ours["tok_s"] / peer["tok_s"]
        want.append(
            [
                m["label"],
                measure,
                f"{ours['tok_s']:.2f}",
                f"{peer['tok_s']:.2f}",
                f"{ratio:.2f}x",
                _goal(goal),
                f"{ratio / goal:.0%}",
            ]
        )
    _assert_rows(
        "| model file | measure | pagedrs tok/s | llama.cpp tok/s | ratio | goal | of goal |", want
    )


def _tok_s(model_run: Any, engine: str, n: str) -> float:
    """An engine's decode tokens/s at ``n`` sequences in a bench_quantized model run."""
    return float(model_run[engine]["decode"][n]["tok_s"])


def test_panels_table_xeon() -> None:
    now = _results("quantized_panels_xeon-amx_2026-12-06.json")["models"]
    want = []
    for name in ("1b", "gemma3"):
        earlier = _results(f"quantized_{name}_xeon-amx_2026-12-06.json")["models"][name]
        for n in ("16", "64", "256"):
            ours, peer = now[name]["pagedrs"]["decode"][n], now[name]["llama.cpp"]["decode"][n]
            old = _tok_s(earlier, "pagedrs", n) / _tok_s(earlier, "llama.cpp", n)
            ratio = ours["tok_s"] / peer["tok_s"]
            want.append(
                [
                    now[name]["label"],
                    n,
                    f"{ours['tok_s']:.2f}",
                    f"{peer['tok_s']:.2f}",
                    f"{ratio:.2f}x",
                    f"{old:.2f}x",
                    _goal(GOALS[n]),
                ]
            )
    _assert_rows(
        "| model file | sequences | pagedrs tok/s | llama.cpp tok/s | ratio "
        "| ratio before | goal |",
        want,
    )


#: Issue 42's goal for a load: pagedrs' seconds to the first token over llama.cpp's.
LOAD_GOALS = {"first": "1.2x", "second": "1.0x"}


def test_first_token_against_llama_cpp_table() -> None:
    run = _results("gguf_load_vs_llamacpp_xeon-amx_2026-12-06.json")
    want = []
    for key, m in run["models"].items():
        for load in ("first", "second"):
            mine, peer = m[f"pagedrs.{load}"], m[f"llama.cpp.{load}"]
            want.append(
                [
                    f"{LABELS[key]} ({m['file_bytes'] / 1e9:.2f} GB)",
                    load,
                    *(
                        f"{r['first_token_seconds']:.2f} ({r['first_token_cpu_seconds']:.2f})"
                        for r in (mine, peer)
                    ),
                    f"{mine['first_token_seconds'] / peer['first_token_seconds']:.2f}x",
                    LOAD_GOALS[load],
                    " / ".join(f"{r['after_load']['VmHWM'] / 1e9:.2f}" for r in (mine, peer)),
                ]
            )
    _assert_rows(
        "| model file | load | pagedrs: s to first token (CPU s) | llama.cpp: s to first token "
        "(CPU s) | ratio | goal | peak RSS GB |",
        want,
    )


def _trees_rows(
    name: str, goal: bool, trees: tuple[str, str] = ("main", "this")
) -> list[list[str]]:
    """Rows of a main / this / llama.cpp table: seconds to the first token,
    each tree's with its ratio over llama.cpp's."""
    want = []
    for key, m in _results(name)["models"].items():
        for load in ("first", "second"):
            peer = m[f"llama.cpp.{load}"]["first_token_seconds"]
            cells = []
            for tree in trees:
                s = m[f"{tree}.{load}"]["first_token_seconds"]
                cells.append(f"{s:.2f} ({s / peer:.2f}x)")
            row = [LABELS[key], load, *cells, f"{peer:.2f}"]
            want.append([*row, LOAD_GOALS[load]] if goal else row)
    return want


def test_skeleton_table() -> None:
    _assert_rows(
        "| model file | load | main: s (ratio) | this: s (ratio) | llama.cpp: s | goal |",
        _trees_rows("gguf_load_skeleton_xeon-amx_2026-12-06.json", goal=True),
    )


def test_lazy_gguf_load_table() -> None:
    _assert_rows(
        "| model file | load | base: s (ratio) | this: s (ratio) | llama.cpp: s | goal |",
        _trees_rows("gguf_load_lazy_gguf_epyc-zen5_2026-12-06.json", True, ("base", "this")),
    )


def test_config_cache_table() -> None:
    _assert_rows(
        "| model file | load | main | this | llama.cpp |",
        _trees_rows("gguf_load_config_cache_xeon-amx_2026-12-06.json", goal=False),
    )


def test_behind_llama_cpp_table_xeon() -> None:
    """The Xeon's loads (furthest over their goal first), then its speeds
    (furthest below their goal first), from the two tables above."""
    ranked: list[tuple[tuple[int, float], list[str]]] = []
    loads = _results("gguf_load_vs_llamacpp_xeon-amx_2026-12-06.json")["models"]
    for key in ("smollm2", "gemma3", "1b"):
        for load, goal in LOAD_GOALS.items():
            m = loads[key]
            ratio = (
                m[f"pagedrs.{load}"]["first_token_seconds"]
                / m[f"llama.cpp.{load}"]["first_token_seconds"]
            )
            over = ratio / float(goal.rstrip("x"))
            row = [
                f"{load} load",
                LABELS[key],
                f"{ratio:.2f}x",
                f"at most {goal}",
                f"{over:.1f}x over",
            ]
            ranked.append(((0, -over), row))
    for m, measure, ours, peer, target in _goal_measures():
        ratio = ours["tok_s"] / peer["tok_s"]
        row = [measure, m["label"], f"{ratio:.2f}x", _goal(target), f"{ratio / target:.0%}"]
        ranked.append(((1, ratio / target), row))
    want = [row for _, row in sorted(ranked, key=lambda kr: kr[0])]
    _assert_rows("| measure | file | ratio | goal | of goal |", want)


def test_avx512_panel_fill_table() -> None:
    run = _results("quant_kernel_fill512_epyc-zen5_2026-12-06.json")
    want = [
        [
            r["format"],
            str(r["rows"]),
            f"{r['base']['gops']:.1f}",
            f"{r['new']['gops']:.1f}",
            f"{r['speedup']:.2f}x",
        ]
        for r in run["results"]
    ]
    _assert_rows(
        "| format | rows | before: GOP/s | after: GOP/s | after / before |",
        want,
    )


def test_lazy_gguf_load_prose() -> None:
    """Gemma 3's spread over both trees and the run's load average."""
    run = _results("gguf_load_lazy_gguf_epyc-zen5_2026-12-06.json")
    text = " ".join(PAGE.read_text().split())
    gemma = run["models"]["gemma3"]
    for load, words in (("second", "(second load)"), ("first", "(first)")):
        s = [
            r["first_token_seconds"] for t in ("base", "this") for r in gemma[f"{t}.{load}"]["runs"]
        ]
        assert f"{min(s):.2f}-{max(s):.2f} s {words}" in text
    avg = run["loadavg_end"]
    assert f"load average {min(avg):.1f}-{max(avg):.1f} from other" in text


#: The two weight shapes of the layout A/B kernel runs.
SHAPES = ("131072x2048", "2048x8192")


def _layout_ab_rows(names: list[str]) -> list[list[str]]:
    """The rows of a rows-against-panels kernel table from
    ``quant_kernel_ab.py``'s JSONs ``names``, in order."""
    want = []
    for name in names:
        run = _results(name)
        assert (run["base_args"], run["new_args"]) == ("--layout rows", "--layout panels")
        n, k = run["shape"]["n"], run["shape"]["k"]
        want += [
            [
                f"{n} x {k}",
                r["format"],
                str(r["rows"]),
                f"{r['base']['gops']:.1f}",
                f"{r['new']['gops']:.1f}",
                f"{r['speedup']:.2f}x",
            ]
            for r in run["results"]
        ]
    return want


def test_panel_layout_kernel_table() -> None:
    _assert_rows(
        "| N x K | format | rows | file's rows: GOP/s | panels: GOP/s | panels / rows |",
        _layout_ab_rows([f"quant_kernel_repack_{s}_epyc-zen5_2026-12-06.json" for s in SHAPES]),
    )


def test_q5_panels_kernel_table() -> None:
    _assert_rows(
        "| N x K | format | rows | file's rows: GOP/s | panels with Q5: GOP/s | panels / rows |",
        _layout_ab_rows([f"quant_kernel_q5panels_{s}_epyc-zen5_2026-12-07.json" for s in SHAPES]),
    )


def test_q8_0_threshold_kernel_table() -> None:
    _assert_rows(
        "| N x K | format | rows | file's rows: GOP/s | panels, copied from 128 rows: GOP/s "
        "| panels / rows |",
        _layout_ab_rows(["quant_kernel_q8_0_threshold_2048x8192_epyc-zen5_2026-12-07.json"]),
    )


def test_panel_layout_end_to_end_table() -> None:
    before = _results("quantized_1b_rows_epyc-zen5_2026-12-06.json")["models"]["1b"]
    after = _results("quantized_1b_panels_epyc-zen5_2026-12-06.json")["models"]["1b"]
    want = []
    for n in ("1", "16", "64"):
        b, a = before["pagedrs"]["decode"][n]["tok_s"], after["pagedrs"]["decode"][n]["tok_s"]
        cb, ca = before["llama.cpp"]["decode"][n]["tok_s"], after["llama.cpp"]["decode"][n]["tok_s"]
        want.append(
            [n, f"{b:.1f}", f"{b / cb:.2f}x", f"{a:.1f}", f"{a / ca:.2f}x", f"{a / b:.2f}x"]
        )
    _assert_rows(
        "| sequences | rows: tok/s | rows / llama.cpp | panels: tok/s | panels / llama.cpp "
        "| panels / rows |",
        want,
    )


def test_k_quant_panel_kernel_table() -> None:
    _assert_rows(
        "| N x K | format | rows | k-quant rows: GOP/s | k-quant panels: GOP/s | panels / rows |",
        _layout_ab_rows([f"quant_kernel_repack_k_{s}_epyc-zen5_2026-12-07.json" for s in SHAPES]),
    )


def test_k_quant_panel_end_to_end_table() -> None:
    before = _results("quantized_gemma3_krows_epyc-zen5_2026-12-07.json")["models"]["gemma3"]
    after = _results("quantized_gemma3_kpanels_epyc-zen5_2026-12-07.json")["models"]["gemma3"]
    want = []
    for n in ("1", "16", "64"):
        b, a = before["pagedrs"]["decode"][n]["tok_s"], after["pagedrs"]["decode"][n]["tok_s"]
        cb, ca = before["llama.cpp"]["decode"][n]["tok_s"], after["llama.cpp"]["decode"][n]["tok_s"]
        want.append(
            [n, f"{b:.1f}", f"{b / cb:.2f}x", f"{a:.1f}", f"{a / ca:.2f}x", f"{a / b:.2f}x"]
        )
    _assert_rows(
        "| sequences | k-quants in rows: tok/s | rows / llama.cpp | k-quants in panels: tok/s "
        "| panels / llama.cpp | panels / rows |",
        want,
    )


SERVING_HEADER = (
    "| engine | request rate (req/s) | prompts | TPOT p50 (ms) | TPOT p90 (ms) | TTFT p90 (s) "
    "| output tok/s | output tokens | server CPU share |"
)


def test_serving_peers_table() -> None:
    """``pagedrs serve`` against llama-server under vLLM's client: every point
    of each engine, the saturation point first."""
    run = _results("serving_peers_1b_epyc-zen5_2026-12-06.json")
    want = []
    for name, row in run["engines"].items():
        for p in ([row["saturation"]] if "saturation" in row else []) + row["points"]:
            rate = "all at once" if p["request_rate"] == "inf" else f"{p['request_rate']:g}"
            want.append(
                [
                    name,
                    rate,
                    str(p["num_prompts"]),
                    f"{p['tpot_p50_ms']:.0f}",
                    f"{p['tpot_p90_ms']:.0f}",
                    f"{p['ttft_p90_ms'] / 1e3:.1f}",
                    f"{p['output_throughput']:.1f}",
                    f"{p['output_len_min']}-{p['output_len_max']}",
                    f"{p['server_cpu_share']:.2f}",
                ]
            )
    _assert_rows(SERVING_HEADER, want)
    text = " ".join(PAGE.read_text().split())
    best = run["highest_rate_under_bound"]
    assert f"pagedrs keeps TPOT p90 under 200 ms up to {best['pagedrs']:g} req/s" in text
    assert f"llama.cpp up to {best['llama.cpp']:g} req/s" in text
    assert f"pagedrs / llama.cpp = {run['ratio']:.2f}x" in text


def test_panels_load_table() -> None:
    m = _results("gguf_load_panels_epyc-zen5_2026-12-06.json")["models"]["1b"]
    want = []
    for load in ("first", "second"):
        runs = [m[f"{e}.{load}"] for e in ("rows", "panels", "llama.cpp")]
        want.append(
            [
                load,
                *(f"{r['first_token_seconds']:.2f}" for r in runs),
                " / ".join(f"{r['after_load']['VmHWM'] / 1e9:.2f}" for r in runs),
            ]
        )
    _assert_rows(
        "| load | rows: s to first token | panels: s to first token | llama.cpp: s to first "
        "token | rows / panels / llama.cpp peak RSS GB |",
        want,
    )
    text = " ".join(PAGE.read_text().split())
    added = [
        m[f"panels.{x}"]["first_token_seconds"] - m[f"rows.{x}"]["first_token_seconds"]
        for x in ("first", "second")
    ]
    assert f"adds {min(added):.2f}-{max(added):.2f} s to this file's load" in text
    second = (
        m["panels.second"]["first_token_seconds"] / m["llama.cpp.second"]["first_token_seconds"]
    )
    assert f"the second load is {second:.2f}x llama.cpp's" in text


#: ``benches/step_profile.py``'s categories, in the page's order.
STEP_CATEGORIES = [
    "projection: qkv",
    "projection: o",
    "projection: gate/up",
    "projection: down",
    "projection: LM head",
    "attention: kernel",
    "attention: K/V write",
    "attention: Python",
    "RMSNorm",
    "rotary embedding",
    "SiLU x up, layer Python",
    "residual adds",
    "embedding, layer loop",
    "final norm, logits",
    "sampling",
    "runner, metadata",
    "engine: scheduler, outputs",
]

#: The profile's steps: (column, key path into the JSON).
STEP_COLUMNS = [
    ("1", "decode", "1", "decode_step"),
    ("16", "decode", "16", "decode_step"),
    ("64", "decode", "64", "decode_step"),
    ("64 prompts", "decode", "64", "prompt_step"),
    ("prefill", "prefill", None, "step"),
]


def _steps(run: Any) -> list[dict[str, Any]]:
    return [run[a][b][c] if b is not None else run[a][c] for _, a, b, c in STEP_COLUMNS]


def _step_profile_rows(run: Any) -> list[list[str]]:
    """Milliseconds per step and share of the step of each category, then the
    projections' and the rest's totals and the step."""
    steps = _steps(run)
    rows = []
    for cat in STEP_CATEGORIES:
        cells = []
        for s in steps:
            ms = s["categories_ms"].get(cat, 0.0)
            cells.append(f"{ms:.2f} ({100 * ms / s['ms']:.1f}%)")
        rows.append([cat, *cells])
    for label, pick in (
        ("all projections", lambda c: c.startswith("projection: ")),
        ("everything else", lambda c: not c.startswith("projection: ")),
    ):
        cells = []
        for s in steps:
            ms = sum(v for k, v in s["categories_ms"].items() if pick(k))
            cells.append(f"{ms:.2f} ({100 * ms / s['ms']:.1f}%)")
        rows.append([f"**{label}**", *cells])
    rows.append(["**step**", *[f"{s['ms']:.2f}" for s in steps]])
    return rows


STEP_PROFILE_HEADER = (
    "| main: ms (share) | 1 sequence: decode step | 16: decode step | 64: decode step "
    "| 64: prompt step (1,024 tokens) | prefill (2,048 tokens) |"
)

STEP_PROFILE_AFTER_HEADER = (
    "| step | main: step ms | this: step ms | main: outside the projections ms "
    "| this: outside the projections ms | this / main, outside |"
)


def _step_profile_after_rows(main: Any, this: Any) -> list[list[str]]:
    rows = []
    names = ["1 sequence: decode step", "16: decode step", "64: decode step"]
    names += ["64: prompt step (1,024 tokens)", "prefill (2,048 tokens)"]
    for name, m, t in zip(names, _steps(main), _steps(this), strict=True):
        outside = [
            sum(v for k, v in s["categories_ms"].items() if not k.startswith("projection: "))
            for s in (m, t)
        ]
        rows.append(
            [
                name,
                f"{m['ms']:.2f}",
                f"{t['ms']:.2f}",
                f"{outside[0]:.2f}",
                f"{outside[1]:.2f}",
                f"{outside[1] / outside[0]:.2f}x",
            ]
        )
    return rows


def test_step_profile_tables() -> None:
    main = _results("step_profile_1b_main_epyc-zen5_2026-12-07.json")
    this = _results("step_profile_1b_this_epyc-zen5_2026-12-07.json")
    _assert_rows(STEP_PROFILE_HEADER, _step_profile_rows(main))
    _assert_rows(STEP_PROFILE_AFTER_HEADER, _step_profile_after_rows(main, this))


OUTSIDE_HEADER = (
    "| sequences | main: tok/CPU s | main / llama.cpp | this: tok/CPU s | this / llama.cpp "
    "| this / main | goal |"
)


def _cpu_rates(run: Any) -> dict[tuple[str, str], float]:
    """Tokens per CPU second of each engine: output tokens of each batch, prompt
    tokens of the prefill."""
    m = run["models"]["1b"]
    out = {}
    for eng in ("pagedrs", "llama.cpp"):
        for n, d in m[eng]["decode"].items():
            out[(eng, n)] = m["output_tokens"] * int(n) / d["cpu_seconds"]
        p = m[eng]["prefill"]
        out[(eng, "prefill")] = p["tokens"] / p["cpu_seconds"]
    return out


def _outside_rows(ab: Any) -> list[list[str]]:
    goals = {"1": "1.2x", "16": "2x", "64": "3x", "prefill": "2x"}
    rows = []
    for key, goal in goals.items():
        med = {}
        for tree in ("main", "this"):
            rates = [_cpu_rates(r) for r in ab["runs"][tree]]
            med[tree] = [
                statistics.median(r[(eng, key)] for r in rates) for eng in ("pagedrs", "llama.cpp")
            ]
        (pm, lm), (pt, lt) = med["main"], med["this"]
        label = "prefill of 2,048 tokens" if key == "prefill" else key
        rows.append(
            [
                label,
                f"{pm:.1f}",
                f"{pm / lm:.2f}x",
                f"{pt:.1f}",
                f"{pt / lt:.2f}x",
                f"{pt / pm:.2f}x",
                goal,
            ]
        )
    return rows


def test_outside_the_kernels_end_to_end_table() -> None:
    ab = _results("quantized_1b_outside_kernels_epyc-zen5_2026-12-07.json")
    assert len(ab["runs"]["main"]) == len(ab["runs"]["this"]) >= 1
    _assert_rows(OUTSIDE_HEADER, _outside_rows(ab))


def _load_rows(name: str, with_file: bool) -> list[list[str]]:
    """Rows of a main / this / llama.cpp load table (``bench_load.py``):
    seconds to the first token (CPU seconds) of each, this tree's ratio over
    llama.cpp's seconds, the goal, and (without the file's column) the
    three peak resident sets."""
    want = []
    for key, m in _results(name)["models"].items():
        for load in ("first", "second"):
            runs = [m[f"{e}.{load}"] for e in ("main", "this", "llama.cpp")]
            cells = [
                f"{r['first_token_seconds']:.2f} ({r['first_token_cpu_seconds']:.2f})" for r in runs
            ]
            ratio = runs[1]["first_token_seconds"] / runs[2]["first_token_seconds"]
            row = [*cells, f"{ratio:.2f}x", LOAD_GOALS[load]]
            if with_file:
                want.append([LABELS[key], load, *row])
            else:
                rss = " / ".join(f"{r['after_load']['VmHWM'] / 1e9:.2f}" for r in runs)
                want.append([load, *row, rss])
    return want


def test_panel_memory_load_tables() -> None:
    """The Zen 5 loads with every weight's panels in one allocation faulted in
    at once and the header walked once: SmolLM2, Gemma 3 and the 1B shape,
    then the 8B shape with its peak resident sets."""
    cells = (
        "main: s to first token (CPU s) | this: s to first token (CPU s) "
        "| llama.cpp: s to first token (CPU s) | this / llama.cpp | goal |"
    )
    _assert_rows(
        f"| model file | load | {cells}",
        _load_rows("gguf_load_panel_memory_epyc-zen5_2026-12-07.json", with_file=True),
    )
    _assert_rows(
        f"| load | {cells} main / this / llama.cpp peak RSS GB |",
        _load_rows("gguf_load_8b_epyc-zen5_2026-12-07.json", with_file=False),
    )
