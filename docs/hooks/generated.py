"""MkDocs hook: the parts of the site generated from the code and the saved results.

A page asks for generated content with an HTML comment on a line of its own:

- ``<!-- generated: engine-args -->``: one row per ``EngineArgs`` field (flag, type,
  default, choices, the field's docstring entry), from
  ``pagedrs.engine.arg_utils.EngineArgs``.
- ``<!-- generated: model-support -->``: the supported and refused model tables of
  ``pagedrs.executor.model_support``; ``<!-- generated: tensor-parallel-types -->``
  the model types tensor parallelism shards; ``<!-- generated: gguf-architectures -->``
  the GGUF architectures loaded quantized (``pagedrs.executor.quant.gguf_archs``).
- ``<!-- bench: FILE [PATH] [OPTION=VALUE ...] -->``: a table of
  ``benches/results/FILE`` (or of the object at the dotted ``PATH`` inside it), dated
  by the last commit that changed the file. Options: ``keep=GLOB,GLOB`` keeps the
  columns whose dotted name matches one of the globs, in the globs' order;
  ``rows=GLOB,GLOB`` keeps the rows (items) whose key matches; ``by=FIELD`` names the items of
  a list by their ``FIELD`` instead of their index; ``transpose=1`` swaps rows and
  columns; ``pct=1`` shows fractions as percentages.
- ``<!-- generated: bench-other -->``: every results file no marker of the site names,
  whole, so a new results file appears without editing a page.

The plots ``benches/results/*.png`` are copied into the site as ``img/bench/NAME.png``.
An unknown marker, a missing file or a path that is not in the file fails the build, and
so does a page whose text cites a results file that is not there (``missing_results``).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import fnmatch
import itertools
import json
import re
import shlex
import subprocess
import typing
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benches" / "results"
PLOT_DIR = "img/bench"

_MARKER = re.compile(r"^([ \t]*)<!-- (generated|bench): (.*?) -->$", re.M)
_named_results: set[str] = set()

# A cited path may hold shell braces and globs: ``planner_{engine,serving}_zen5_pass{1,2}.json``.
CITED = re.compile(r"benches/results/[A-Za-z0-9_./{},*-]+\.(?:json|png|md|txt)")
# A results file named alone, in backticks: ``planner_cpu_zen5.json``.
BARE = re.compile(r"`([A-Za-z0-9_.{},*-]+\.json)`")
# JSON files the docs name that are not benchmark results.
NOT_RESULTS = {
    "adapter_config.json",
    "alpaca_en_demo.json",
    "dpo_en_demo.json",
    "gpu_check.json",
    "tokenizer.json",
    "tokenizer_config.json",
}
# As ``on_page_markdown`` reads them: on a line of their own.
BENCH_MARKER = re.compile(r"^[ \t]*<!-- bench: (\S+).*-->$", re.M)


def _expand(pattern: str) -> list[str]:
    """Shell brace expansion of ``pattern`` (``a{b,c}`` -> ``ab``, ``ac``)."""
    parts = re.split(r"\{([^{}]*)\}", pattern)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


def missing_results(text: str) -> list[str]:
    """The results files ``text`` (a page's Markdown) cites that are not in the
    checkout, as sorted paths from the repository root: ``benches/results/...``
    paths (braces expanded; a glob needs one match), ``<!-- bench: FILE -->``
    markers and bare backticked ``*.json`` names other than ``NOT_RESULTS``."""
    cited = [p for m in CITED.findall(text) for p in _expand(m)]
    cited += [f"benches/results/{name}" for name in BENCH_MARKER.findall(text)]
    bare = [p for m in BARE.findall(text) for p in _expand(m) if p not in NOT_RESULTS]
    cited += [f"benches/results/{name}" for name in bare]
    return sorted({p for p in cited if not any(ROOT.glob(p))})


def on_files(files: Files, config: Any) -> Files:
    """Add the saved benchmark plots to the site."""
    for png in sorted(RESULTS.glob("*.png")):
        files.append(File.generated(config, f"{PLOT_DIR}/{png.name}", abs_src_path=str(png)))
    return files


def on_pre_build(config: Any) -> None:
    """Collect the results files named by any page, for ``bench-other``."""
    _named_results.clear()
    for md in Path(config["docs_dir"]).rglob("*.md"):
        for _, kind, arg in _MARKER.findall(md.read_text()):
            if kind == "bench":
                _named_results.add(shlex.split(arg)[0])


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    """Replace each marker of the page with its generated Markdown."""

    missing = missing_results(markdown)
    if missing:
        raise PluginError(f"{page.file.src_uri} cites missing results files: {missing}")

    def replace(match: re.Match[str]) -> str:
        indent = match.group(1)
        text = generate(match.group(2), match.group(3).strip())
        return "\n".join(indent + line if line else line for line in text.split("\n"))

    def generate(kind: str, arg: str) -> str:
        where = f"{page.file.src_uri}: <!-- {kind}: {arg} -->"
        try:
            if kind == "bench":
                return bench_table(arg)
            if arg == "engine-args":
                return engine_args_table()
            if arg == "model-support":
                from pagedrs.executor.model_support import readme_tables

                return readme_tables()
            if arg == "gguf-architectures":
                from pagedrs.executor.quant.gguf_archs import gguf_table

                return gguf_table()
            if arg == "tensor-parallel-types":
                from pagedrs.executor.model_support import TENSOR_PARALLEL_MODEL_TYPES

                return ", ".join(f"`{t}`" for t in TENSOR_PARALLEL_MODEL_TYPES) + "."
            if arg == "bench-other":
                return bench_other()
        except (OSError, KeyError, ValueError, TypeError) as e:
            raise PluginError(f"{where}: {e}") from e
        raise PluginError(f"{where}: unknown marker")

    return _MARKER.sub(replace, markdown)


# ---------------------------------------------------------------------------
# Configuration: EngineArgs


def _type_name(hint: Any) -> str:
    if hint is type(None):
        return "None"
    args = typing.get_args(hint)
    if args:
        return " | ".join(_type_name(a) for a in args)
    return getattr(hint, "__name__", str(hint))


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def engine_args_table() -> str:
    """Markdown table of every ``EngineArgs`` field."""
    from pagedrs.engine.arg_utils import EngineArgs

    hints = typing.get_type_hints(EngineArgs)
    docs = EngineArgs.field_docs()
    rows = [
        "| field | command-line flag | type | default | description |",
        "|---|---|---|---|---|",
    ]
    for f in dataclasses.fields(EngineArgs):
        flag = "--" + f.name.replace("_", "-")
        if hints[f.name] is bool:
            flag = f"{flag}, --no-{flag[2:]}"
        elif f.name == "model":
            flag = "`MODEL` (serve), `--model` (generate)"
        flag = flag if flag.startswith("`") else f"`{flag}`"
        default = "None" if f.default is None else repr(f.default)
        description = docs.get(f.name, "")
        if f.name in EngineArgs.CHOICES:
            choices = ", ".join(f"`{c}`" for c in EngineArgs.CHOICES[f.name])
            description += f" Choices: {choices}."
        rows.append(
            f"| `{f.name}` | {flag} | `{_cell(_type_name(hints[f.name]))}` "
            f"| `{_cell(default)}` | {_cell(description)} |"
        )
    return "\n".join(rows)


# ---------------------------------------------------------------------------
# Benchmarks: benches/results/*.json


def result_date(path: Path) -> str:
    """Date (YYYY-MM-DD) of the last commit that changed ``path``; the file's
    modification date outside a git checkout or for an uncommitted file."""
    try:
        out = subprocess.run(
            ["git", "log", "-1", "--format=%cs", "--", str(path)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        out = ""
    if out:
        return out
    return _dt.date.fromtimestamp(path.stat().st_mtime).isoformat()


def _fmt(v: Any, pct: bool) -> str:
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, float):
        if pct and abs(v) <= 1.0:
            return f"{100 * v:.2f}%" if 0 < abs(v) < 0.01 else f"{100 * v:.1f}%"
        if v != 0 and abs(v) < 0.001:
            return f"{v:.2e}"
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        return f"{v:.4g}"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, (list, tuple)):
        return ", ".join(_fmt(x, pct) for x in v)
    return str(v)


def _flatten(obj: Any, by: str | None, prefix: str = "") -> dict[str, Any]:
    """Leaves of ``obj`` keyed by dotted paths (list items by index or ``by``)."""
    if isinstance(obj, dict):
        items = [(str(k), v) for k, v in obj.items()]
    elif isinstance(obj, list) and obj and all(isinstance(x, dict) for x in obj):
        items = [(str(x[by]) if by and by in x else str(i), x) for i, x in enumerate(obj)]
    else:
        return {prefix: obj}
    out: dict[str, Any] = {}
    for k, v in items:
        if by and k == by:
            continue
        out.update(_flatten(v, by, f"{prefix}.{k}" if prefix else k))
    return out


def _common_affix(names: list[str], suffix: bool) -> str:
    parts = [n.split(".") for n in names]
    if suffix:
        parts = [p[::-1] for p in parts]
    common: list[str] = []
    for column in zip(*parts, strict=False):
        if len(set(column)) != 1:
            break
        common.append(column[0])
    if any(len(p) == len(common) for p in parts):
        common = common[:-1]
    return ".".join(common[::-1] if suffix else common)


def _table(obj: Any, options: dict[str, str]) -> tuple[str, str]:
    """(Markdown table, caption note) of a dict or list: one row per item, one
    column per leaf of the items (dotted), or two columns for a dict of scalars."""
    by = options.get("by")
    pct = options.get("pct") == "1"
    if isinstance(obj, list):
        obj = {str(x.get(by, i)) if by else str(i): x for i, x in enumerate(obj)}
    if not isinstance(obj, dict):
        raise ValueError(f"a table needs an object or a list, got {type(obj).__name__}")
    if "rows" in options:
        globs = options["rows"].split(",")
        obj = {k: v for k, v in obj.items() if any(fnmatch.fnmatchcase(str(k), g) for g in globs)}
        if not obj:
            raise ValueError(f"no row matches rows={options['rows']}")
    scalars = all(not isinstance(v, (dict, list)) or not v for v in obj.values())
    if scalars:
        rows = {k: {"value": v} for k, v in obj.items()}
    else:
        rows = {str(k): _flatten(v, by) for k, v in obj.items()}
    columns: list[str] = []
    for leaves in rows.values():
        columns += [c for c in leaves if c not in columns]
    if "keep" in options:
        globs = options["keep"].split(",")
        columns = [c for g in globs for c in columns if fnmatch.fnmatchcase(c, g)]
        columns = list(dict.fromkeys(columns))  # in the order of the globs
        if not columns:
            raise ValueError(f"no column matches keep={options['keep']}")
    note = ""
    if len(columns) > 1:
        head = _common_affix(columns, suffix=False)
        tail = _common_affix(columns, suffix=True)
        shown = [c[len(head) + 1 if head else 0 :] for c in columns]
        shown = [s[: -(len(tail) + 1)] if tail and s.endswith("." + tail) else s for s in shown]
        note = "; ".join(x for x in (head, tail) if x)
    else:
        shown = list(columns)
    header = [""] + shown
    body = [[k] + [_fmt(rows[k].get(c, ""), pct) for c in columns] for k in rows]
    if options.get("transpose") == "1":
        grid = [header] + body
        grid = [list(r) for r in zip(*grid, strict=True)]
        header, body = grid[0], grid[1:]
    lines = ["| " + " | ".join(_cell(h) for h in header) + " |"]
    lines.append("|" + "---|" * len(header))
    lines += ["| " + " | ".join(_cell(c) for c in r) + " |" for r in body]
    return "\n".join(lines), note


def bench_table(arg: str) -> str:
    """Markdown for one ``<!-- bench: ... -->`` marker."""
    words = shlex.split(arg)
    name, rest = words[0], words[1:]
    path = rest[0] if rest and "=" not in rest[0] else ""
    options = dict(w.split("=", 1) for w in rest if "=" in w)
    file = RESULTS / name
    obj: Any = json.loads(file.read_text())
    for key in path.split(".") if path else []:
        if not isinstance(obj, dict) or key not in obj:
            raise KeyError(f"{name} has no {path!r} (missing {key!r})")
        obj = obj[key]
    table, note = _table(obj, options)
    where = f"`benches/results/{name}`" + (f" → `{path}`" if path else "")
    extra = f"; values: `{note}`" if note else ""
    return f"{table}\n\n<small>{where}, committed {result_date(file)}{extra}.</small>\n"


def bench_other() -> str:
    """Every results file no page names, each top-level object as a table."""
    out: list[str] = []
    for file in sorted(RESULTS.glob("*.json")):
        if file.name in _named_results:
            continue
        obj = json.loads(file.read_text())
        out.append(f"### `{file.name}`\n")
        scalars = {k: v for k, v in obj.items() if not isinstance(v, (dict, list))}
        nested = {k: v for k, v in obj.items() if isinstance(v, (dict, list)) and v}
        if scalars:
            out.append(_table(scalars, {})[0] + "\n")
        for key, value in nested.items():
            out.append(f"`{key}`:\n")
            out.append(_table(value, {})[0] + "\n")
        out.append(f"<small>committed {result_date(file)}.</small>\n")
    return "\n".join(out) if out else "Every saved result is shown above."
