"""The generated parts of the docs site (``docs/hooks/generated.py``) against their
sources: every ``EngineArgs`` field documented, the model tables those of
``model_support``, every benchmark marker resolving to a table of its results file."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
from pathlib import Path
from types import ModuleType

import pytest
from pagedrs.engine.arg_utils import EngineArgs
from pagedrs.executor.model_support import REFUSED_FEATURES, SUPPORTED_MODEL_TYPES

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hook", DOCS / "hooks" / "generated.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


HOOK = _hook()
MARKERS = [
    (md.relative_to(ROOT).as_posix(), kind, arg)
    for md in sorted(DOCS.rglob("*.md"))
    for _, kind, arg in HOOK._MARKER.findall(md.read_text())
]


def test_every_engine_arg_is_a_documented_row() -> None:
    table = HOOK.engine_args_table().splitlines()[2:]
    fields = [f.name for f in dataclasses.fields(EngineArgs)]
    assert [re.match(r"\| `(\w+)` \|", row).group(1) for row in table] == fields  # type: ignore[union-attr]
    docs = EngineArgs.field_docs()
    assert [f for f in fields if not docs.get(f)] == [], "fields without an Attributes: entry"
    block_size = next(row for row in table if row.startswith("| `block_size` |"))
    assert "`--block-size`" in block_size and "| `int` |" in block_size and "| `16` |" in block_size


def test_generated_markers_are_on_their_pages() -> None:
    generated = {(page, arg) for page, kind, arg in MARKERS if kind == "generated"}
    assert ("docs/configuration.md", "engine-args") in generated
    assert ("docs/models.md", "model-support") in generated
    assert ("docs/benchmarks.md", "bench-other") in generated


def test_model_tables_list_every_type_and_refusal() -> None:
    from pagedrs.executor.model_support import readme_tables

    text = readme_tables()
    for model_type in SUPPORTED_MODEL_TYPES:
        assert f"| `{model_type}` |" in text
    for feature in REFUSED_FEATURES:
        assert f"| {feature} |" in text


@pytest.mark.parametrize(
    "arg", [arg for _, kind, arg in MARKERS if kind == "bench"], ids=lambda a: a.split()[0]
)
def test_bench_marker_renders(arg: str) -> None:
    text = HOOK.bench_table(arg)
    name = arg.split()[0]
    assert f"`benches/results/{name}`" in text and "committed 20" in text
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    assert len(rows) >= 2, text


def test_bench_table_values_are_the_files() -> None:
    data = json.loads((ROOT / "benches/results/routing.json").read_text())
    text = HOOK.bench_table("routing.json rows=hit_rate transpose=1")
    for router, rate in data["hit_rate"].items():
        assert f"| {router} | {rate:.4g} |" in text
