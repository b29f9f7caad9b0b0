"""Figures in the prose of docs/benchmarks.md and docs/scale-out.md (beside the
generated tables) that come from ``benches/results/*.json``: each equals its
JSON's value at the precision printed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = "docs/benchmarks.md"


def _results(name: str) -> Any:
    return json.loads((ROOT / "benches" / "results" / name).read_text())


def _assert_says(page: str, *figures: str) -> None:
    text = " ".join((ROOT / page).read_text().split())  # line breaks as spaces
    missing = [f for f in figures if f not in text]
    assert not missing, f"{page} does not say {missing} (its results file does)"


def _span(values: list[float], fmt: str) -> str:
    return f"{min(values):{fmt}}-{max(values):{fmt}}"


def test_memory_prose() -> None:
    memory = _results("memory.json")
    share, alpaca = memory["traces"]["sharegpt"], memory["traces"]["alpaca"]
    bound, paper = share["bound"]["paged-16"], memory["paper"]
    hybrid = alpaca["hybrid"]
    full = hybrid["hybrid-16-all-full"]["mean_batch"]
    w512, w256 = hybrid["hybrid-16-w512"]["mean_batch"], hybrid["hybrid-16-w256"]["mean_batch"]
    _assert_says(
        BENCHMARKS,
        f"ShareGPT-like trace: {share['num_requests']} requests, mean prompt "
        f"{share['mean_prompt']:.0f} / output {share['mean_output']:.0f} tokens",
        f"Alpaca-like ({alpaca['num_requests']} requests, {alpaca['mean_prompt']:.0f} / "
        f"{alpaca['mean_output']:.0f} tokens)",
        f"{bound['waste_of_allocated']:.2%} < {bound['bound']:.1%} for block 16 on ShareGPT "
        f"(T = {share['mean_seq_len']:.0f} tokens)",
        f"The paper reports {paper['token_states_pct']['orca-max']}% token states for the Orca "
        f"baselines (mean batch {paper['mean_batch']['orca-max']:.2f} for Orca (Max), "
        f"{paper['mean_batch']['orca-oracle']:.2f} for Orca (Oracle)) and "
        f"{paper['token_states_pct']['paged-16']}% for vLLM at block 16 "
        f"(batch {paper['mean_batch']['paged-16']:.2f})",
        f"(sequences of {alpaca['mean_seq_len']:.0f} tokens on average) "
        f"window 512 gives {w512 / full:.2f}x and 256 gives {w256 / full:.2f}x "
        f"(batch {w256:.2f} vs {full:.2f})",
    )
    assert memory["hybrid_sanity"]["all_full_equals_paged_16"]  # "equals paged-16 exactly"


def test_memory_window_1024_prose() -> None:
    run = _results("memory_window1024.json")
    assert run["trace"] == "sharegpt" and run["setting"]["hybrid"]["windows"] == [1024]
    full, w1024 = run["hybrid"]["hybrid-16-all-full"], run["hybrid"]["hybrid-16-w1024"]
    _assert_says(
        BENCHMARKS,
        f"`benches/results/memory_window1024.json`: batch {w1024['mean_batch']:.2f}, "
        f"{w1024['mean_batch'] / full['mean_batch']:.2f}x)",
    )


def test_throughput_prose() -> None:
    hf, orca = _results("throughput.json"), _results("throughput_orca.json")
    agree = hf["greedy_agreement_with_pagedrs"]
    same = {(a["requests_identical"], a["requests"]) for a in agree.values()}
    orca_same = {
        (a["requests_identical"], a["requests"])
        for a in orca["greedy_agreement_with_pagedrs"].values()
    }
    assert len(same) == 1 and len(orca_same) == 1
    (n_same, n), (o_same, o_n) = same.pop(), orca_same.pop()
    offline = hf["offline_tokens_per_s"]
    _assert_says(
        BENCHMARKS,
        f"Greedy tokens of both HF systems equal pagedrs' on {n_same}/{n} requests",
        f"unloaded per-token latency ({hf['bound_s_per_token']:.2f} s/token)",
        f"Every system produced the same greedy tokens ({o_same}/{o_n} requests)",
        f"HF `generate` at {offline['hf-generate']:.0f} and HF continuous batching at "
        f"{offline['hf-generate-batch']:.0f} output tokens/s against pagedrs' "
        f"{offline['pagedrs']:.0f}",
    )


def _by(rows: list[dict[str, Any]], **where: Any) -> dict[str, Any]:
    (row,) = [r for r in rows if all(r[k] == v for k, v in where.items())]
    return row


def _latency(row: dict[str, Any]) -> float:
    return float(row["normalized_latency_s_per_token"]["mean"])


def test_ablation_prose() -> None:
    ablations = _results("ablations.json")["ablations"]
    prefix, blocks, preempt = (
        ablations["shared_prefix"],
        ablations["block_size"],
        ablations["preemption"],
    )
    said = []
    for shots in (1, 5):
        on, off = (_by(prefix, shots=shots, prefix_caching=c) for c in (True, False))
        hits = on["prefix_cache_hits"] / on["prefix_cache_queries"]
        said.append(
            f"from {_latency(off):.2f} to {_latency(on):.2f} s/token ({shots}-shot, "
            f"{on['prefix_tokens']}{'-token prefix' if shots == 1 else ' tokens'}, {hits:.0%}"
        )
    one = [_by(prefix, shots=1, prefix_caching=c)["output_tokens_per_s"] for c in (False, True)]
    five = [_by(prefix, shots=5, prefix_caching=c)["output_tokens_per_s"] for c in (False, True)]
    said.append(f"throughput {one[0]:.0f} -> {one[1]:.0f} and {five[0]:.0f} -> {five[1]:.0f} tok/s")
    sizes = (8, 16, 32)

    def per_size(values: list[float]) -> str:
        return " / ".join(f"{v:.2f}" for v in values)

    share = [_latency(_by(blocks, trace="sharegpt", block_size=b)) for b in sizes]
    alpaca = [_latency(_by(blocks, trace="alpaca", block_size=b)) for b in sizes]
    said.append(f"give {per_size(share)} s/token on ShareGPT-like and {per_size(alpaca)} on")
    swap = [_by(preempt, mode="swap", block_size=b) for b in sizes]
    recompute = [_by(preempt, mode="recompute", block_size=b) for b in sizes]
    preemptions = [r["num_preemptions"] for r in swap + recompute]
    said += [
        f"{min(preemptions)}-{max(preemptions)} preemptions",
        f"swap {per_size([_latency(r) for r in swap])} s/token vs recompute "
        f"{per_size([_latency(r) for r in recompute])}",
        f"with {' / '.join(str(r['num_swapped_out']) for r in swap)} blocks swapped each way",
    ]
    assert all(r["num_swapped_in"] == r["num_swapped_out"] for r in swap)
    _assert_says(BENCHMARKS, *said)


def test_cpu_speed_prose() -> None:
    steps = _results("decode_step.json")["steps"]
    linear = _results("linear.json")["tokens"]
    offline = _results("offline_256_sharegpt.json")
    speedups = ", ".join(f"{linear[n]['speedup']:.2f}x at {n}" for n in ("16", "64", "256"))
    packed = (
        f"{linear['4']['speedup']:.2f}x faster at 4 tokens, {speedups}, "
        f"{linear['2048']['speedup']:.2f}x at 2,048"
    )
    _assert_says(
        BENCHMARKS,
        f"the step at 256 sequences reaches {steps['pagedrs + rust']['256']['tokens_per_s']:.0f} "
        "tokens/s",
        f"{packed}, and {linear['1']['speedup']:.2f}x at 1 token",
        f"packed faster by {packed.replace(' faster', '')}; "
        f"{linear['1']['speedup']:.2f}x at 1 (one row",
        f"**{offline['offline_tokens_per_s']['pagedrs']:.0f} output tokens/s, "
        f"{offline['offline_total_tokens_per_s']['pagedrs']:.0f} tokens/s prompt + output**",
    )
    assert offline["offline_requests"] == 256
    run = _results("decode_step.json")
    assert abs(run["bound_tokens_per_s"] - run["matmul_gflops"] * 1e9 / (2 * run["params"])) < 1
    _assert_says(
        BENCHMARKS,
        f"fp32 matmul measures {run['matmul_gflops']:.0f}-305 GFLOP/s",
        f"the pure matmul bound is {run['bound_tokens_per_s']:.0f}-"
        f"{305e9 / (2 * run['params']):,.0f} tokens/s",  # a matmul step's 2 FLOPs a weight
    )
    # The token counts the page gives, over the JSON's rates, take its wall time.
    prompt, output = 82_554, 78_781
    rate, total = offline["offline_tokens_per_s"]["pagedrs"], offline["offline_total_tokens_per_s"]
    seconds = output / rate
    assert abs((prompt + output) / total["pagedrs"] - seconds) < 0.5
    _assert_says(
        BENCHMARKS,
        f"({prompt:,} prompt + {output:,} output tokens): {seconds:.0f} s, **{rate:.0f} output",
    )


def test_serving_prose() -> None:
    servers = _results("serving_saturation.json")["servers"]

    def gain(split: str) -> str:
        one, two = (servers[f"{split}:{n}"]["saturated"]["output_tokens_per_s"] for n in (1, 2))
        return f"{two / one - 1:.0%}"

    _assert_says(
        BENCHMARKS,
        f"torch's second thread buys {gain('thread')}; with the core alone in its process it "
        f"buys {gain('process')}",
    )


def test_dense_linear_row() -> None:
    kernel = _results("dense_linear.json")["kernel"]

    def speedups(rows: set[int]) -> list[float]:
        return [k["speedup"] for k in kernel if k["rows"] in rows]

    assert all(k["dense_inv"] == 1.0 for k in kernel)
    assert all(k["f_linear_inv"] == 0.0 for k in kernel if k["rows"] >= 2)
    _assert_says(
        BENCHMARKS,
        f"one thread: {_span(speedups({1}), '.2f')}x at 1 row, "
        f"{min(speedups({2, 4, 8, 16})):.1f}-{max(speedups({2, 4, 8, 16})):.0f}x faster at "
        f"2-16 rows, {_span(speedups({64}), '.2f')}x at 64, {_span(speedups({256}), '.2f')}x "
        "at 256; every sampled row bit-equal to the row alone (`F.linear`: none from 2 rows up)",
    )


def test_dense_linear_configuration_prose() -> None:
    results = _results("dense_linear.json")
    kernel, e2e = results["kernel"], {r["seqs"]: r["on_over_off"] for r in results["e2e"]}

    def span(rows: set[int], fmt: str = ".2f", top: str = ".2f") -> str:
        speedups = [k["speedup"] for k in kernel if k["rows"] in rows]
        return f"{min(speedups):{fmt}}-{max(speedups):{top}}x"

    _assert_says(
        "docs/configuration.md",
        f"At one row the two are level ({span({1})},",
        f"From 2 to 16 rows the kernel is {span({2, 4, 8, 16}, '.1f', '.0f')} faster",
        f"At 64 rows it is {span({64})} and at 256 rows {span({256})} of MKL",
        f"On is {e2e[1]:.2f}x off at 1 sequence and {e2e[16]:.2f}x at 16",
    )


def test_routing_prose() -> None:
    routing = _results("routing.json")
    names = {
        "round_robin": "round robin",
        "power_of_two": "power of two",
        "ray_prefix_affinity": "Ray's `PrefixCacheAffinityRouter`",
    }
    hit, p50, p90 = routing["hit_rate"], routing["ttft_p50_s"], routing["ttft_p90_s"]
    tok = routing["output_tokens_per_s"]

    def row(k: str) -> str:
        unit = " s" if k == "round_robin" else ""  # the first row names the unit
        return f"{hit[k]:.2f} / {p50[k]:.2f}{unit} / {p90[k]:.2f}{unit} / {tok[k]:.1f}"

    under = [1 - p90["pagedrs"] / p90[k] for k in names]
    p90_under = f"p90 {min(under) * 100:.0f}-{max(under):.0%} under"
    vs_p2 = f"{1 - p50['pagedrs'] / p50['power_of_two']:.0%} under power of two's"
    vs_ray = f"{1 - p50['pagedrs'] / p50['ray_prefix_affinity']:.0%} under Ray's"
    more = f"{tok['pagedrs'] / tok['ray_prefix_affinity'] - 1:.0%}"
    _assert_says(
        BENCHMARKS,
        *(f"{names[k]} {row(k)}" for k in names),
        f"**pagedrs {row('pagedrs')}**",
        f"beats round robin by {(hit['pagedrs'] - hit['round_robin']) * 100:.0f} points",
        f"TTFT p50 {vs_p2} and {vs_ray}, {p90_under} every other, +{more} output tok/s",
    )
    _assert_says(
        "docs/scale-out.md",
        f"(p50 {vs_p2}, {vs_ray}; {p90_under} the others) and {more} more output",
    )


def test_hybrid_capacity_prose() -> None:
    run = _results("hybrid_capacity.json")
    g3, so = run["gemma3_like"], run["sliding_only"]
    mib = 1 << 20
    contexts = so["context_tokens"]
    window = contexts.index(4096)
    past = set(so["kv_bytes_hybrid"][window:])
    peak = set(so["peak_kv_bytes_hybrid"][window + 1 :])
    assert len(past) == 1 and len(peak) == 1  # flat past the window
    (held,), (held_peak,) = past, peak
    full_gib = " / ".join(f"{b / (1 << 30):.0f}" for b in so["kv_bytes_full"][window + 1 :])
    _assert_says(
        "docs/kv-cache.md",
        f"fits {g3['max_concurrent_hybrid']} requests in a KV budget where allocating every "
        f"layer for every token fits {g3['max_concurrent_full']} ({g3['ratio']:.2f}x, "
        f"{g3['share_of_analytic']:.1%} of the analytic {g3['analytic_ratio']:.2f}x)",
        f"holds {held / mib:.0f} MiB per request past its 4096-token window where full "
        f"allocation grows to {so['kv_bytes_full'][-1] / (1 << 30):.0f} GiB at 32k",
    )
    _assert_says(
        BENCHMARKS,
        f"{g3['max_concurrent_hybrid']} vs {g3['max_concurrent_full']} requests at once: "
        f"**{g3['ratio']:.1f}x**, {g3['share_of_analytic']:.1%} of the analytic "
        f"{g3['analytic_ratio']:.2f} ({g3['kv_bytes_per_request_hybrid'] / mib:.0f} vs "
        f"{g3['kv_bytes_per_request_full'] / mib:.0f} MiB a request); Mistral-like: "
        f"{held / mib:.0f} MiB at every context from 4k to 32k ({held_peak / mib:.0f} MiB peak "
        f"during a 2048-token prefill chunk) vs {full_gib} GiB at 8k / 16k / 32k",
    )


def test_kv_cache_dtype_capacity_table() -> None:
    quality = _results("kv_quality.json")
    per_block, capacity = quality["bytes_per_block"], quality["capacity_vs_float32"]
    rows = [f"| float32 | {per_block['float32']:,} | 1.00x |"]
    rows += [f"| bfloat16 | {per_block['bfloat16']:,} | {capacity['bfloat16']:.2f}x |"]
    assert per_block["fp8_e4m3"] == per_block["fp8_e5m2"]
    rows += [f"| fp8_e4m3, fp8_e5m2 | {per_block['fp8_e4m3']:,} | {capacity['fp8_e4m3']:.2f}x |"]
    rows += [f"| int8 | {per_block['int8']:,} | **{capacity['int8']:.2f}x** |"]
    _assert_says("docs/kv-cache.md", *rows)


def test_kv_cache_dtype_memory_prose() -> None:
    """The paper setting's slots and mean batch per KV cache dtype (paged-16,
    bytes a token with int8's scales), both traces."""
    traces = _results("memory.json")["traces"]
    share, alpaca = traces["sharegpt"]["kv_cache_dtypes"], traces["alpaca"]["kv_cache_dtypes"]
    int8, fp16 = share["int8"], share["auto"]
    _assert_says(
        "docs/kv-cache.md",
        f"int8's {int8['bytes_per_token']:,} bytes a token against fp16's "
        f"{fp16['bytes_per_token']:,} give {int8['slots']:,} slots instead of {fp16['slots']:,} "
        f"and a mean batch of {int8['mean_batch']:.1f} instead of {fp16['mean_batch']:.1f} on "
        f"ShareGPT (fp8: {share['fp8']['mean_batch']:.1f}), {alpaca['int8']['mean_batch']:.1f} "
        f"instead of {alpaca['auto']['mean_batch']:.1f} on Alpaca.",
    )
    paged = traces["sharegpt"]["policies"]["paged-16"]
    assert fp16["mean_batch"] == paged["mean_batch"], "fp16 is the paged-16 row"


def test_kv_cache_invariance_prose() -> None:
    """docs/kv-cache.md's batch-invariance prose: bfloat16 rows on the prepacked
    MLP shapes equal the row alone at every row count measured, float32 rows none;
    float32 weights' outputs alone against in a batch, float32 and int8 caches."""
    run = _results("invariance.json")
    rows = run["matmul_rows_equal"]
    counts = sorted({int(n) for shape in rows["bfloat16"].values() for n in shape})
    assert all(v == f"{n}/{n}" for shape in rows["bfloat16"].values() for n, v in shape.items())
    assert all(v == f"0/{n}" for shape in rows["float32"].values() for n, v in shape.items())
    engine = run["engine"]
    _assert_says(
        "docs/kv-cache.md",
        f"every row of both MLP shapes at {', '.join(map(str, counts[:-1]))} and "
        f"{counts[-1]:,} rows equals the row computed alone, `matmul_rows_equal`",
        f"a row's bits differ alone and in a batch of any size 0 of {counts[-2]} times",
        f"float32 absorbs this ({engine['float32/auto']['alone_vs_batch']}), but an int8 cache "
        "turns some last-bit differences of K/V into different int8 roundings "
        f"({engine['float32/int8']['alone_vs_batch']})",
    )


def test_kv_cache_dtype_speed_prose() -> None:
    """docs/kv-cache.md's reasons for the float32 default: bfloat16 weights'
    decode step at 256 sequences and offline rates over float32's, and the
    perplexity of bfloat16 weights over an int8 cache against float32's."""
    decode = _results("decode_step_kv_dtypes.json")["configs"]
    offline = _results("offline_dtype_sharegpt.json")["configs"]
    quality = _results("kv_quality.json")["quality"]
    ppl = abs(quality["bfloat16/int8"]["perplexity"] - quality["float32/float32"]["perplexity"])
    assert ppl < 0.01
    _assert_says(
        "docs/kv-cache.md",
        f"bfloat16 weights decode about "
        f"{decode['bfloat16/auto']['256'] / decode['float32/auto']['256']:.0f}x faster than "
        f"float32 at 256 sequences, and with an int8 KV cache run offline "
        f"{offline['bfloat16/int8'] / offline['float32/auto']:.1f}x faster, "
        f"{offline['bfloat16/auto'] / offline['float32/auto']:.1f}x with a bfloat16 cache, at a "
        "perplexity within 0.01 of float32's",
    )


def test_other_benchmarks_core_and_kv_quality_rows() -> None:
    """docs/benchmarks.md's "Other benchmarks" rows of ``bench_core.py`` (the
    Rust core's CPU time a step against vLLM's scheduler, one Zen 5 run) and
    ``bench_kv_quality.py`` (int8 against float32 KV, float32 weights)."""
    core = _results("bench_core_vs_vllm_zen5_2026-12-06.json")
    ours, theirs, ratio = (
        core["pagedrs_s_per_step"],
        core["vllm_s_per_step"],
        core["vllm_over_pagedrs"],
    )
    assert core["cpu"].startswith("AMD EPYC family 26 model 2 (Zen 5 class)")
    quality = _results("kv_quality.json")
    int8, f32 = quality["quality"]["float32/int8"], quality["quality"]["float32/float32"]
    _assert_says(
        "docs/benchmarks.md",
        f"decode, 256 seqs: {ours['decode_256'] * 1e6:.0f} us/step "
        f"({ours['decode_256'] * 1e6 / 256:.2f} us per sequence) vs vLLM "
        f"{theirs['decode_256'] * 1e3:.1f} ms: **{ratio['decode_256']:.0f}x**; 16 seqs: "
        f"{ratio['decode_16']:.0f}x; 1024 seqs: {ratio['decode_1024']:.0f}x; prefill of 256 x 1024 "
        f"tokens sharing 512: {ours['prefill_shared'] * 1e3:.2f} ms/step vs "
        f"{theirs['prefill_shared'] * 1e3:.1f} ms ({ratio['prefill_shared']:.0f}x) |",
        f"| int8: {quality['capacity_vs_float32']['int8']:.2f}x float32's tokens, mean "
        f"\\|dlogprob\\| {int8['mean_abs_dlogprob']:.3f} (float32 weights), perplexity "
        f"{int8['perplexity']:.3f} vs {f32['perplexity']:.3f}",
    )
