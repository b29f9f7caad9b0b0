"""docs/quantization-figures.md's prose figures (the first-token times on
Zen 4, the GGUF architectures' accuracy on Zen 4 and at the 1B shape on the
Xeon, the Xeon's loads against llama.cpp and its rates and peaks against issue
41's goals, Gemma 3 on HF's modules against pagedrs' own code on the Xeon, the
summary's ratios) equal what their ``benches/results/*.json``
hold, at the precision printed."""

from __future__ import annotations

import math
import statistics
from typing import Any

from test_quant_figures import LABELS, PAGE, ZEN5, _goal_measures, _results, _zen5_measures


def _says(*figures: str) -> None:
    text = " ".join(PAGE.read_text().split())
    missing = [f for f in figures if f not in text]
    assert not missing, f"docs/quantization-figures.md does not say {missing} (its JSON does)"


def test_gguf_architectures_prose() -> None:
    rows = _results("gguf_archs_zen4_2026-12-05.json")["rows"]
    sensitive = {k for k, r in rows.items() if r["arch"].endswith("moe") or r["arch"] == "phi3"}
    dense = [r["pagedrs_vs_reference"] for k, r in rows.items() if k not in sensitive]
    others = [rows[k]["pagedrs_vs_reference"] for k in sensitive]
    assert max(dense) <= 0.0005  # "within 0.0005 nats a token ... on every dense architecture"
    gap = max(abs(r["llama_cpp_vs_reference"] - r["mean_abs_dlogprob"]) for r in rows.values())
    assert gap <= 0.002  # "equals the pagedrs-llama.cpp distance within 0.002 nats"
    int8 = [r["reference_int8_activations_vs_reference"] for r in rows.values()]
    trained = [r for r in rows.values() if r["weights"] == "trained"]
    agree = sorted(r["agreement"] for r in trained)
    apart = sorted(r["mean_abs_dlogprob"] for r in trained)
    moe2 = rows["qwen2moe"]
    _says(
        f"({min(others):.1g}-{max(others):.2g} on the mixtures of experts and Phi-3)",
        f"moves it by the same order ({min(int8):.2f}-{max(int8):.2f})",
        f"agree on {agree[0] * 100:.0f}-{agree[-1]:.0%} of next tokens, "
        f"{apart[0]:.2f}-{apart[-1]:.2f} nats apart",
        f"(Qwen2-MoE agrees on {moe2['agreement']:.0%} of positions, "
        f"{moe2['reference_int8_activations_vs_reference']:.2f} nats moved by int8 activations",
    )


def _load_cpu_ratio(key: str) -> float:
    """pagedrs' median load CPU seconds over llama.cpp's (gguf_load_2026-12-03.json)."""
    runs = _results("gguf_load_2026-12-03.json")["runs"]
    first = runs["small"][key] if "seconds" in runs["small"][key]["this"] else runs["8b"][key]
    mine = [first["this"], runs["repeat2"][key]["pagedrs"], runs["repeat3"][key]["pagedrs"]]
    peer = [runs[r][key]["llama.cpp"] for r in ("llama.cpp", "repeat2", "repeat3")]
    cpu = [statistics.median(r["cpu_seconds"] for r in group) for group in (mine, peer)]
    return float(cpu[0] / cpu[1])


def test_summary_bullets() -> None:
    """The summary's ratios restate the tables' (Zen 5, and the Zen 4 runs)."""
    z5 = {k: {m: p / c for m, (p, c) in _zen5_measures(k).items()} for k in ZEN5}
    z4_8b = [
        _results(f"quantized_zen4_8b{part}_2026-12-04.json")["models"]["8b"]
        for part in ("", "_256", "_prefill")
    ]

    def z4(n: str) -> float:
        (m,) = (r for r in z4_8b[:2] if n in r["pagedrs"]["decode"])
        return float(m["pagedrs"]["decode"][n]["tok_s"] / m["llama.cpp"]["decode"][n]["tok_s"])

    after = _results("quantized_zen4_1seq_after_2026-12-04.json")["models"]
    peer = _results("quantized_zen4_1seq_llamacpp_2026-12-04.json")["models"]
    one = {
        k: after[k]["pagedrs"]["decode"]["1"]["tok_s"]
        / peer[k]["llama.cpp"]["decode"]["1"]["tok_s"]
        for k in ("1b", "gemma3", "smollm2")
    }
    pre = z4_8b[2]
    big = [z5["gemma3"]["decode 64"], z5["gemma3"]["decode 256"]]
    smol = [z5["smollm2"]["decode 64"], z5["smollm2"]["decode 256"]]
    rss = [v for k in ("smollm2", "gemma3", "1b") for m, v in z5[k].items() if m.startswith("rss")]
    rss4 = [
        m[e]["decode"][n]["vmhwm"]
        for m in z4_8b[:2]
        for n in m["pagedrs"]["decode"]
        if n != "16"
        for e in ("pagedrs", "llama.cpp")
    ]
    rss4_ratios = [rss4[i] / rss4[i + 1] for i in range(0, len(rss4), 2)]
    load = {k: _load_cpu_ratio(k) for k in LABELS}
    _says(
        f"{z5['1b']['decode 1']:.2f}x on the 1B shape, {z5['gemma3']['decode 1']:.2f}x on Gemma 3 "
        f"and {z5['8b']['decode 1']:.2f}x on the 8B shape; {z5['smollm2']['decode 1']:.2f}x on "
        "SmolLM2",
        f"{one['1b']:.2f}x (1B shape), {one['gemma3']:.2f}x (Gemma 3) and {one['smollm2']:.2f}x "
        f"(SmolLM2); {z4('1'):.2f}x on the 8B shape",
        f"{z5['1b']['decode 16']:.2f}x on the 1B shape and {z5['8b']['decode 16']:.2f}x on the 8B "
        f"shape ({z4('16'):.2f}x on the Zen 4 machine), against {z5['gemma3']['decode 16']:.2f}x "
        f"on Gemma 3 and {z5['smollm2']['decode 16']:.2f}x on SmolLM2",
        f"except the 1B shape's 256 sequences ({z5['1b']['decode 256']:.2f}x)",
        f"{z5['1b']['decode 64']:.2f}x on the 1B shape at 64 sequences, {min(big):.2f}-"
        f"{max(big):.2f}x on Gemma 3 and {min(smol):.2f}-{max(smol):.2f}x on SmolLM2 at 64-256; "
        f"prefill of 2,048 tokens {z5['gemma3']['prefill']:.2f}x (Gemma 3), "
        f"{z5['1b']['prefill']:.2f}x (1B) and {z5['smollm2']['prefill']:.2f}x (SmolLM2); "
        f"{pre['pagedrs']['prefill']['tok_s'] / pre['llama.cpp']['prefill']['tok_s']:.2f}x on the "
        "8B shape on the Zen 4 machine",
        f"({z4('64'):.2f}x at 64, {z4('256'):.2f}x at 256 sequences)",
        f"pagedrs' peak is {z5['8b']['rss 6.55']:.2f}x llama.cpp's at 8B (no second copy of the "
        f"weights; {min(rss4_ratios):.2f}-{max(rss4_ratios):.2f}x at 1 to 256 sequences on the "
        f"Zen 4 machine) but {min(rss):.1f}-{max(rss):.1f}x at 135M-1B",
        f"{load['8b']:.1f}x llama.cpp's CPU time at 8B",
        f"{load['1b']:.1f}x at 1B and {min(load['smollm2'], load['gemma3']):.0f}-"
        f"{max(load['smollm2'], load['gemma3']):.0f}x on the small files",
    )


def test_load_against_llama_cpp_prose() -> None:
    models = _results("gguf_load_vs_llamacpp_xeon-amx_2026-12-06.json")["models"]

    def first_token(key: str, engine: str, load: str) -> list[float]:
        """The runs' seconds to the first token, in run order."""
        return [r["first_token_seconds"] for r in models[key][f"{engine}.{load}"]["runs"]]

    def ratio(load: str) -> float:
        m = models["1b"]
        return float(
            m[f"pagedrs.{load}"]["first_token_seconds"]
            / m[f"llama.cpp.{load}"]["first_token_seconds"]
        )

    behind = (
        models["1b"]["pagedrs.second"]["first_token_seconds"]
        - models["1b"]["llama.cpp.second"]["first_token_seconds"]
    )
    gemma = first_token("gemma3", "pagedrs", "second")
    smol = first_token("smollm2", "pagedrs", "second")
    peer_spread = max(
        max(s) - min(s)
        for s in (first_token(k, "llama.cpp", load) for k in models for load in ("first", "second"))
    )
    assert peer_spread <= 0.1 + 5e-4  # "llama.cpp's spread at most 0.1 s"
    _says(
        f"({ratio('first'):.2f}x first, {ratio('second'):.2f}x second: pagedrs' second load "
        f"is {behind:.2f} s behind llama.cpp's)",
        f"Gemma 3's second load spread {min(gemma):.2f}-{max(gemma):.2f} s over the 3 runs "
        f"(the median {statistics.median(gemma):.2f}), SmolLM2's {min(smol):.2f}-{max(smol):.2f} s",
    )


def test_gguf_architectures_1b_xeon_prose() -> None:
    rows = _results("gguf_archs_1b_xeon-amx_2026-12-06.json")["rows"]
    dense = {k: r for k, r in rows.items() if not r["arch"].endswith("moe")}
    int8_own = max(
        abs(r["pagedrs_vs_reference"] - r["reference_int8_activations_vs_reference"])
        for r in dense.values()
    )
    assert int8_own <= 0.04  # "within 0.04 nats of the reference's with int8 activations"
    behind = {k for k, r in rows.items() if r["pagedrs_vs_reference"] > r["llama_cpp_vs_reference"]}
    assert behind == {"llama", "llama (SmolLM2-135M)"}
    further = [
        r["llama_cpp_vs_reference"] - r["pagedrs_vs_reference"]
        for k, r in rows.items()
        if k not in behind
    ]
    random_dense = [
        r["agreement"] for k, r in dense.items() if r["weights"] == "random" and k != "phi3"
    ]
    trained = {f"{r['agreement']:.2f}" for r in rows.values() if r["weights"] == "trained"}
    assert len(trained) == 1  # "0.95 on the two trained files"
    llama, smol = rows["llama"], rows["llama (SmolLM2-135M)"]
    qwen3, phi3, moe2, moe3 = rows["qwen3"], rows["phi3"], rows["qwen2moe"], rows["qwen3moe"]

    def against(r: dict[str, float]) -> str:
        """llama.cpp's distance against pagedrs', at 3 decimals."""
        return f"{r['llama_cpp_vs_reference']:.3f} against {r['pagedrs_vs_reference']:.3f}"

    _says(
        f"the random Llama-shaped one ({llama['pagedrs_vs_reference']:.3f} against "
        f"{llama['llama_cpp_vs_reference']:.3f}) and SmolLM2 "
        f"({smol['pagedrs_vs_reference']:.4f} against {smol['llama_cpp_vs_reference']:.4f})",
        f"llama.cpp is {min(further):.3f}-{max(further):.2f} nats further from the reference "
        f"(Qwen3: {qwen3['llama_cpp_vs_reference']:.3f} against pagedrs' "
        f"{qwen3['pagedrs_vs_reference']:.3f}; Phi-3: {against(phi3)}; "
        f"Qwen2-MoE: {against(moe2)})",
        f"engines is {min(random_dense):.2f}-{max(random_dense):.2f} on the random dense files "
        f"but Phi-3 ({phi3['agreement']:.2f}), {trained.pop()} on the two trained files, "
        f"{moe3['agreement']:.2f} on the random Qwen3-MoE and {moe2['agreement']:.2f} on the "
        "random Qwen2-MoE",
        "alone moves the reference by "
        f"{phi3['reference_int8_activations_vs_reference']:.2f} nats a token on Phi-3, "
        f"{moe3['reference_int8_activations_vs_reference']:.2f} on Qwen3-MoE and "
        f"{moe2['reference_int8_activations_vs_reference']:.2f} on Qwen2-MoE",
    )


def test_issue_41_xeon_prose() -> None:
    gib = 1 << 30
    runs = {
        name: _results(f"quantized_{name}_xeon-amx_2026-12-06.json")["models"][name]
        for name in ("1b", "gemma3")
    }

    def rate(name: str, engine: str, n: str) -> float:
        return float(runs[name][engine]["decode"][n]["tok_s"])

    def peaks(name: str, engine: str) -> str:
        """``VmHWM`` through 1 / 16 / 64 / 256 sequences, GiB."""
        d = runs[name][engine]["decode"]
        return " / ".join(f"{d[n]['vmhwm'] / gib:.2f}" for n in ("1", "16", "64", "256"))

    whole = {k: m["pagedrs"]["end"]["VmHWM"] / gib for k, m in runs.items()}
    bound = {
        k: (1.25 * m["file_bytes"] + gib + m["pagedrs"]["kv_bytes"]) / gib for k, m in runs.items()
    }
    over = {f"{whole[k] - bound[k]:.2f}" for k in runs}
    assert len(over) == 1  # "0.23 GiB over issue 30's bound on both"
    before = {f"{m['pagedrs']['before_load']['VmHWM'] / gib:.2f}" for m in runs.values()}
    assert len(before) == 1
    _says(
        f"(1B: {rate('1b', 'llama.cpp', '16'):.1f} to {rate('1b', 'llama.cpp', '256'):.1f} tok/s; "
        f"Gemma 3: {rate('gemma3', 'llama.cpp', '16'):.1f} to "
        f"{rate('gemma3', 'llama.cpp', '256'):.1f}), pagedrs' rises "
        f"(1B: {rate('1b', 'pagedrs', '16'):.1f} to {rate('1b', 'pagedrs', '256'):.1f}; "
        f"Gemma 3: {rate('gemma3', 'pagedrs', '16'):.1f} to "
        f"{rate('gemma3', 'pagedrs', '256'):.1f})",
        f"1B shape {peaks('1b', 'pagedrs')} GiB against {peaks('1b', 'llama.cpp')} GiB; "
        f"Gemma 3 {peaks('gemma3', 'pagedrs')} GiB against {peaks('gemma3', 'llama.cpp')} GiB",
        f"holds {before.pop()} GiB before the model loads",
        f"pagedrs peaks at {whole['1b']:.2f} GiB on the 1B shape and {whole['gemma3']:.2f} GiB "
        f"on Gemma 3, {over.pop()} GiB over issue 30's bound on both",
        f"the run's largest batch: {bound['1b']:.2f} and {bound['gemma3']:.2f} GiB)",
    )


def test_gemma3_own_code_xeon_prose() -> None:
    """The ``bench_quantized.py`` rounds of Gemma 3 on HF's modules (``main``)
    against pagedrs' own model code (``branch``): per sequence count, the span
    over all rounds of a run's CPU seconds over its output tokens a sequence
    (one decode step's CPU, the prompts' processing included), in ms. The
    in-process profile beside them is not saved; the page says so."""
    run = _results("quantized_gemma3_native_xeon_2026-12-06.json")
    assert run["cpu"] == "Intel(R) Xeon(R) Processor (family 6 model 167, AVX-512)"
    rounds = {code: [r for r in run["runs"] if r["code"] == code] for code in ("main", "branch")}
    lengths = sorted({r["output_tokens"] for r in run["runs"]})
    counts = {n: sum(r["output_tokens"] == n for r in rounds["main"]) for n in lengths}
    assert all(len(rs) == len(run["runs"]) // 2 for rs in rounds.values())
    assert counts == {n: sum(r["output_tokens"] == n for r in rounds["branch"]) for n in lengths}

    def span(code: str, seqs: str) -> str:
        ms = [1e3 * r["decode"][seqs]["cpu_seconds"] / r["output_tokens"] for r in rounds[code]]
        return f"{min(ms):.1f}-{max(ms):.1f} ms"

    _says(
        f"{len(rounds['main'])} rounds of each, "
        + " and ".join(f"{counts[n]} of {n}" for n in lengths)
        + " output tokens a sequence",
        f"give one sequence {span('main', '1')} of CPU a step on HF's modules against "
        f"{span('branch', '1')} on pagedrs' own code, and 64 sequences "
        f"{span('main', '64')} against {span('branch', '64')}.",
        "A profile in process, not saved under `benches/results`",
    )


def _load_groups(key: str) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """A file's load runs in gguf_load_2026-12-03.json: the first run (its
    ``base``, the tree before the change), pagedrs' three and llama.cpp's three."""
    runs = _results("gguf_load_2026-12-03.json")["runs"]
    first = runs["small"][key] if "seconds" in runs["small"][key]["this"] else runs["8b"][key]
    mine = [first["this"], runs["repeat2"][key]["pagedrs"], runs["repeat3"][key]["pagedrs"]]
    peer = [runs[r][key]["llama.cpp"] for r in ("llama.cpp", "repeat2", "repeat3")]
    return first, mine, peer


def test_load_prose() -> None:
    """The load table's prose: the imports' resident set before a load, the
    peaks, CPU time against the tree before the change and against llama.cpp."""

    def median(group: list[dict[str, Any]], f: Any) -> float:
        return float(statistics.median(f(r) for r in group))

    def cpu(r: dict[str, Any]) -> float:
        return float(r["cpu_seconds"])

    def peak(r: dict[str, Any]) -> float:
        return float(r["after_load"]["VmHWM"] / 1e9)

    groups = {key: _load_groups(key) for key in LABELS}
    imports = {
        f"{r['before_load']['VmHWM'] / 1e9:.2f}" for _, mine, _ in groups.values() for r in mine
    }
    peer_start = {
        f"{r['before_load']['VmHWM'] / 1e9:.2f}" for _, _, peer in groups.values() for r in peer
    }
    assert len(imports) == 1 and len(peer_start) == 1
    faster = [cpu(first["base"]) / median(mine, cpu) for first, mine, _ in groups.values()]
    vs_peer = {k: median(mine, cpu) / median(peer, cpu) for k, (_, mine, peer) in groups.items()}
    small = [vs_peer["smollm2"], vs_peer["gemma3"]]
    big_first, big_mine, big_peer = groups["8b"]
    gemma_before = peak(groups["gemma3"][0]["base"])
    _says(
        f"({imports.pop()} GB of pagedrs' is torch, transformers and pagedrs imported before the "
        f"load starts; llama.cpp's process starts at {peer_start.pop()} GB)",
        f"before the change Gemma 3 was not ({gemma_before:.2f} GB:",
        f"At 8B pagedrs' load peaks at {median(big_mine, peak):.2f} GB against llama.cpp's "
        f"{median(big_peer, peak):.2f} GB",
        f"CPU time is {min(faster):.1f}-{max(faster):.1f}x lower than before the change (the 8B "
        f"shape: {cpu(big_first['base']):.1f} -> {median(big_mine, cpu):.1f} s); against "
        f"llama.cpp it is {vs_peer['8b']:.1f}x at 8B, {vs_peer['1b']:.1f}x at 1B and "
        f"{min(small):.0f}-{max(small):.0f}x on the two small files",
    )


def test_issue_41_xeon_closest_goals_prose() -> None:
    """Issue 41's goals on the Xeon: the three measures nearest their goal and
    the two furthest, as the page names them (ratio of goal)."""
    measures = [
        (m["label"], measure, ours["tok_s"] / peer["tok_s"], goal)
        for m, measure, ours, peer, goal in _goal_measures()
    ]
    by_share = sorted(measures, key=lambda t: t[2] / t[3])
    furthest, closest = by_share[:2], by_share[-3:]
    assert all(r < g for _, _, r, g in measures), "meets none of issue 41's goals"
    one, pre = (
        m for m in measures if m[0].startswith("Llama") and m[1] in ("1 sequence", "prefill 2,048")
    )
    (g256,) = (m for m in measures if m[0].startswith("Gemma") and m[1] == "256 sequences")
    assert {id(m) for m in closest} == {id(one), id(pre), id(g256)}

    def of(m: tuple[str, str, float, float]) -> str:
        return f"{m[2]:.2f}x of {m[3]:g}x"

    s16, s64 = sorted(furthest, key=lambda m: int(m[1].split()[0]))
    assert all(m[0].startswith("Llama") for m in furthest)
    _says(
        f"closest are the 1B shape's one sequence ({of(one)}) and prefill ({of(pre)}) and Gemma "
        f"3's 256 sequences ({of(g256)}); furthest the 1B shape's 16 sequences ({of(s16)}) and "
        f"64 sequences ({of(s64)})"
    )


def _span(values: list[float], fmt: str) -> str:
    return f"{min(values):{fmt}}-{max(values):{fmt}}"


def test_xeon_panels_prose() -> None:
    """The Xeon's runs before and after the panels: the load averages at each
    run's end (1, 5 and 15 minutes), and each ratio's move at 16, 64 and 256."""
    now = _results("quantized_panels_xeon-amx_2026-12-06.json")
    before = {n: _results(f"quantized_{n}_xeon-amx_2026-12-06.json") for n in ("1b", "gemma3")}

    def ratio(run: dict[str, Any], name: str, n: str) -> str:
        m = run["models"][name]
        return f"{m['pagedrs']['decode'][n]['tok_s'] / m['llama.cpp']['decode'][n]['tok_s']:.2f}x"

    def moved(name: str, n: str) -> str:
        return f"{ratio(before[name], name, n)} to {ratio(now, name, n)}"

    earlier = [v for run in before.values() for v in run["loadavg_end"]]
    _says(
        f"(load average {_span(now['loadavg_end'], '.1f')} at this run's end, "
        f"{_span(earlier, '.1f')} at the earlier one's)",
        f"average {_span(earlier, '.1f')} at the end of the runs (1, 5 and 15 minutes)",
        f"(1B shape {moved('1b', '16')} and {moved('1b', '64')}; Gemma 3 {moved('gemma3', '16')} "
        f"and {moved('gemma3', '64')}); at 256 it fell ({moved('1b', '256')}, "
        f"{moved('gemma3', '256')})",
    )


def test_zen5_memory_prose() -> None:
    """The Zen 5 runs' peaks against issue 30's bound (1.25 x file + 1 GiB + the
    KV bytes pagedrs was given), in the table's order, GiB."""
    gib = 1 << 30
    runs = [
        (m, name) for key in ZEN5 for name in ZEN5[key] for m in _results(name)["models"].values()
    ]
    imports = {f"{m['pagedrs']['before_load']['VmHWM'] / gib:.2f}" for m, _ in runs}
    peers = {f"{m['llama.cpp']['before_load']['VmHWM'] / gib:.2f}" for m, _ in runs}
    assert len(imports) == 1 and len(peers) == 1
    kv_gib = [f"{m['pagedrs']['kv_bytes'] / gib:.2f}" for m, _ in runs]
    kv = f"{', '.join(kv_gib[:-1])} and {kv_gib[-1]}"

    def peak(m: dict[str, Any], engine: str = "pagedrs") -> float:
        return float(m[engine]["end"]["VmHWM"] / gib)

    def bound(m: dict[str, Any]) -> float:
        return float((1.25 * m["file_bytes"] + gib + m["pagedrs"]["kv_bytes"]) / gib)

    by = {name: m for m, name in runs}
    smol, gemma = (
        by["quantized_zen5_smollm2_2026-12-03b.json"],
        by["quantized_zen5_gemma3_2026-12-03b.json"],
    )
    b64, b256 = (
        by["quantized_zen5_1b_2026-12-03b.json"],
        by["quantized_zen5_1b_256_prefill_2026-12-03b.json"],
    )
    big = by["quantized_zen5_8b_2026-12-03b.json"]

    def over(m: dict[str, Any]) -> str:
        return f"{peak(m):.2f} against {bound(m):.2f} GiB, {peak(m) - bound(m):+.2f}"

    _says(
        f"process holds {imports.pop()} GiB before the model loads (torch, transformers, pagedrs "
        f"imported), llama.cpp's {peers.pop()} GiB.",
        f"need: {kv} GiB in the table's order). pagedrs is within it on SmolLM2 ({peak(smol):.2f} "
        f"of {bound(smol):.2f} GiB) and the 8B shape ({peak(big):.2f} of {bound(big):.2f} GiB, "
        f"{peak(big) / peak(big, 'llama.cpp'):.2f}x llama.cpp's {peak(big, 'llama.cpp'):.2f} GiB",
        f"it goes over on Gemma 3 ({over(gemma)}) and the 1B shape ({over(b64)}, at 1-64 "
        f"sequences; {over(b256)}, with 256 sequences",
    )
    assert peak(smol) <= bound(smol) and peak(big) <= bound(big)


def test_accuracy_against_hf_prose() -> None:
    """The accuracy table's prose: the margin on issue 30's goal (0.02 nats, to
    its order of magnitude), the kernels' own error, the one Gemma 3 position
    whose top-1 differs, and what the int8 rounding costs against the float
    checkpoint (its error over the engine's, two significant digits)."""
    models = _results("quant_vs_hf_2026-12-03.json")["models"]
    same = [models[k] for k in ("smollm2", "gemma3", "int8")]
    margins = {round(math.log10(0.02 / m["mean_abs_dlogprob"])) for m in same}
    assert margins == {2}, margins  # "a margin of about 100x": its order of magnitude
    own = {f"{m['mean_abs_dlogprob']:.1g}" for m in same}
    assert len(own) == 1
    gemma = models["gemma3"]
    assert round((1 - gemma["greedy_agreement"]) * gemma["positions"]) == 1
    assert all(models[k]["greedy_agreement"] == 1 for k in ("smollm2", "int8"))
    rounding = models["int8"]["vs_float"]
    larger = rounding["mean_abs_dlogprob"] / models["int8"]["mean_abs_dlogprob"]
    _says(
        "(mean |dlogprob| at most 0.02) holds with a margin of about 100x on both GGUF files",
        f"float32 sums in another order), {own.pop()} nats a token.",
        f"Top-1 tokens agree everywhere except one Gemma 3 position of {gemma['positions']:,}.",
        f"is {float(f'{larger:.2g}'):.0f}x larger ({rounding['mean_abs_dlogprob']:.3f} nats a "
        f"token, {rounding['greedy_agreement']:.0%} top-1 agreement)",
    )


def test_summary_goal_and_small_files_prose() -> None:
    """The summary's Zen 5 figures beyond the ratios: issue 30's 3x goal at 64
    sequences, the small files' rates from 16 to 256 sequences, the memory over
    the bound, and the 8B load's CPU seconds."""
    gib = 1 << 30
    z5 = {k: _zen5_measures(k) for k in ZEN5}
    at64 = {
        k: p / c for k, (p, c) in ((k, z5[k]["decode 64"]) for k in ("smollm2", "gemma3", "1b"))
    }
    assert at64["smollm2"] >= 3 > max(at64["gemma3"], at64["1b"])
    small = [z5[k][f"decode {n}"] for k in ("smollm2", "gemma3") for n in ("16", "64", "256")]
    ours, peer = [p for p, _ in small], [c for _, c in small]

    def over(name: str) -> float:
        (m,) = _results(name)["models"].values()
        bound = 1.25 * m["file_bytes"] + gib + m["pagedrs"]["kv_bytes"]
        return float((m["pagedrs"]["end"]["VmHWM"] - bound) / gib)

    gemma = over("quantized_zen5_gemma3_2026-12-03b.json")
    one_b = [over(n) for n in ZEN5["1b"]]
    _, mine, theirs = _load_groups("8b")
    cpu = [statistics.median(r["cpu_seconds"] for r in g) for g in (mine, theirs)]
    _says(
        f"sequences is met on SmolLM2 only ({at64['smollm2']:.2f}x); Gemma 3 "
        f"({at64['gemma3']:.2f}x) and the 1B shape ({at64['1b']:.2f}x) fall short",
        f"files llama.cpp's rate stays at {min(peer):.0f}-{max(peer):.0f} tok/s from 16 to 256 "
        f"sequences while pagedrs' reaches {min(ours):.0f}-{max(ours):.0f} tok/s",
        f"bound (by {gemma:.2f} and {min(one_b):.2f}-{max(one_b):.2f} GiB)",
        f"llama.cpp's CPU time at 8B ({cpu[0]:.1f} against {cpu[1]:.1f} s)",
    )
