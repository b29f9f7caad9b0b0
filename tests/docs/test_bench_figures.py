"""Figures in the docs that come from ``benches/results/*.json``: every cited
file exists, and the headline figures (README's table, docs/benchmarks.md)
equal their JSON's values at the precision printed."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", *sorted((ROOT / "docs").rglob("*.md"))]
CITED = re.compile(r"benches/results/[A-Za-z0-9_./-]+\.(?:json|png|md)")


def _results(name: str) -> Any:
    return json.loads((ROOT / "benches" / "results" / name).read_text())


def _text(page: str) -> str:
    return " ".join((ROOT / page).read_text().split())  # line breaks as spaces


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_cited_results_exist(page: Path) -> None:
    missing = sorted({m for m in CITED.findall(page.read_text()) if not (ROOT / m).exists()})
    assert not missing, f"{page.relative_to(ROOT)} cites missing files: {missing}"


def test_readme_decode_step_figure() -> None:
    step = _results("decode_step.json")["steps"]["pagedrs + rust"]["256"]
    share = f"{step['share_of_bound']:.0%} of the matmul bound"
    want = f"**{step['tokens_per_s']:.0f}** tokens/s ({share})"
    assert want in _text("README.md")


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
