"""Figures in the docs that come from ``benches/results/*.json``: every cited
file exists, and the hand-typed figures (README's headline table, the prose of
docs/benchmarks.md) equal their JSON's values at the precision printed. The tables
under ``<!-- bench: FILE -->`` markers are generated from the files when the site is
built (``docs/hooks/generated.py``)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benches" / "results"
PAGES = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hook", ROOT / "docs/hooks/generated.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


HOOK = _hook()


def _missing(page: Path) -> list[str]:
    """What the site build refuses: the results files ``page`` cites that are missing."""
    return list(HOOK.missing_results(page.read_text()))


def _results(name: str) -> Any:
    return json.loads((RESULTS / name).read_text())


def _text(page: str) -> str:
    return " ".join((ROOT / page).read_text().split())  # line breaks as spaces


def _assert_in(page: str, want: str) -> None:
    assert want in _text(page), f"{page} does not say {want!r} (its results file does)"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_cited_results_exist(page: Path) -> None:
    missing = _missing(page)
    assert not missing, f"{page.relative_to(ROOT)} cites missing files: {missing}"


def test_a_missing_results_file_is_found(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "see `benches/results/planner_{engine,nowhere}_zen5_pass1.json`,\n"
        "`benches/results/quantized_zen5_*_2026-12-03b.json` and\n"
        "<!-- bench: no_such_results.json -->\n"
        "and `planner_cpu_zen9.json`, beside `tokenizer.json`.\n"
    )
    assert _missing(page) == [
        "benches/results/no_such_results.json",
        "benches/results/planner_cpu_zen9.json",
        "benches/results/planner_nowhere_zen5_pass1.json",
    ]


def test_readme_decode_step_figure() -> None:
    step = _results("decode_step.json")["steps"]["pagedrs + rust"]["256"]
    share = f"{step['share_of_bound']:.0%} of the matmul bound"
    want = f"**{step['tokens_per_s']:.0f}** tokens/s ({share})"
    assert want in _text("README.md")


def test_readme_memory_figure() -> None:
    policies = _results("memory.json")["policies"]
    orca = [v["token_states"] for k, v in policies.items() if k.startswith("orca-")]
    paged = policies["paged-16"]["token_states"]
    _assert_in(
        "README.md",
        f"paged: **{paged:.1%}**; Orca baselines {min(orca) * 100:.0f}-{max(orca):.0%}",
    )


def _rate_ratio(results: dict[str, Any], trace: str) -> str:
    """pagedrs' highest rate over the best HF system's, as README prints it: a
    lower bound (``>=``) when pagedrs held the bound at the highest rate swept
    or the HF system missed it at the lowest."""
    censored = results["max_rate_at_bound_censored"][trace]
    rates = results["max_rate_at_bound_by_trace"][trace]
    best_hf = max((k for k in rates if k != "pagedrs"), key=lambda k: rates[k])
    assert rates["pagedrs"] / rates[best_hf] == pytest.approx(
        results["ratio_pagedrs_over_best_hf_by_trace"][trace]
    )
    bound = censored["pagedrs"] == "above" or censored[best_hf] == "below"
    return f"**{'>= ' if bound else ''}{rates['pagedrs'] / rates[best_hf]:.1f}x**"


def test_readme_throughput_figures() -> None:
    results = _results("throughput.json")
    _assert_in(
        "README.md",
        f"{_rate_ratio(results, 'sharegpt')} (ShareGPT-like), "
        f"{_rate_ratio(results, 'alpaca')} (Alpaca-like)",
    )
    rates = _results("throughput_orca.json")["max_rate_at_bound"]["sharegpt"]
    _assert_in(
        "README.md",
        "Orca (Oracle) reservations, same engine | "
        f"**{rates['pagedrs'] / rates['orca-oracle']:.1f}x** |",
    )


def test_readme_offline_figure() -> None:
    dtypes, llama_cpp = _results("offline_dtype_sharegpt.json"), _results("offline_llama_cpp.json")
    for run in (dtypes, llama_cpp):
        assert (run["dataset"], run["num_prompts"], run["best_config"]) == (
            "sharegpt",
            256,
            "bfloat16/int8",
        )
    _assert_in(
        "README.md",
        f"**{dtypes['configs']['bfloat16/int8']:.0f}** output tokens/s; "
        f"**{dtypes['ratio_over_peers']['hf-generate']:.1f}x** HF `generate`, "
        f"**{llama_cpp['ratio_over_peers']['llama.cpp']:.1f}x** llama.cpp "
        f"(first {llama_cpp['peer_prompts']})",
    )


def test_readme_serving_and_routing_figures() -> None:
    readme = _text("README.md")
    assert f"**{_results('serving_saturation.json')['saturation_ratio']:.2f}x**" in readme
    ttft = _results("routing.json")["ttft_p50_s"]
    assert f"TTFT p50 **{ttft['pagedrs']:.2f} s**" in readme
    others = sorted(v for k, v in ttft.items() if k != "pagedrs")
    assert f"vs {others[0]:.2f}-{others[-1]:.2f} s" in readme


def test_own_model_code_against_hf_modules() -> None:
    steps = _results("decode_step.json")["steps"]
    ratio = {
        n: steps["pagedrs + rust"][n]["tokens_per_s"]
        / steps["transformers + rust"][n]["tokens_per_s"]
        for n in ("16", "64", "256")
    }
    want = (
        f"it is {ratio['16']:.2f}x at 16 sequences, {ratio['64']:.2f}x at 64 "
        f"and {ratio['256']:.2f}x at 256"
    )
    assert want in _text("docs/benchmarks.md")


def test_agent_row() -> None:
    configs = _results("agent_1agent.json")["configs"]
    on, off = configs["cache_on_agents_1"], configs["cache_off_agents_1"]
    want = (
        f"1 agent: hit rate {on['prefix_cache_hit_rate']:.2f}; turn-8 TTFT p50 cache on vs off "
        f"{on['turns'][-1]['ttft_s_p50']:.2f} vs {off['turns'][-1]['ttft_s_p50']:.2f} s; "
        f"turn 8 / turn 1 TTFT p50 {on['ttft_ratio_last_first_p50']:.1f}x on, "
        f"{off['ttft_ratio_last_first_p50']:.1f}x off"
    )
    assert want in _text("docs/benchmarks.md")


def test_the_site_build_refuses_a_page_citing_a_missing_file() -> None:
    page = SimpleNamespace(file=SimpleNamespace(src_uri="page.md"))
    text = "see `benches/results/no_such_results.json`, beside `tokenizer.json`.\n"
    with pytest.raises(HOOK.PluginError, match=r"page\.md cites missing results files: "):
        HOOK.on_page_markdown(text, page, {}, None)
    cited = "see `benches/results/routing.json`.\n"
    assert HOOK.on_page_markdown(cited, page, {}, None) == cited
