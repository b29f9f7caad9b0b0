"""The code blocks of README.md and the docs site run, so no example rots.

Every fenced ``python`` block of README.md and ``docs/**/*.md`` runs, the blocks of
one page in order and in one namespace (``__name__`` is ``"__main__"``). Every fenced
``bash`` block is a chain of ``&&`` steps: ``pip install`` of this project (already
done by CI before the tests) or a ``pagedrs ...`` command, run in process through
``pagedrs.cli.main``. A block that cannot run here (a GPU, a Ray cluster, a server that
must stay up) carries ``<!-- no-test: REASON -->`` on the line before its fence, and is
reported as skipped with that reason.

All pages share one ``LLM`` per set of engine arguments (``LLM(...)`` with the same
non-default ``EngineArgs`` fields returns the same engine; its ``shutdown`` waits for
the end of this module), so the default model loads once.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
RUN_LANGS = ("python", "bash")
_FENCE = re.compile(r"^```(\w*)\s*$")
_NO_TEST = re.compile(r"^<!-- no-test: (.*\S) -->$")


@dataclasses.dataclass(frozen=True)
class Block:
    """One fenced code block of a page."""

    page: str  # relative to the repository root
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    skip: str | None  # the no-test reason, if any

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def extract_blocks(path: Path) -> list[Block]:
    """Fenced blocks (at the start of a line) of a Markdown file, in order.

    Raises:
        ValueError: a fence that is never closed, or a no-test comment with no
            block right after it.
    """
    rel = path.relative_to(ROOT).as_posix()
    lines = path.read_text().splitlines()
    blocks: list[Block] = []
    i = 0
    pending: tuple[int, str] | None = None  # (line, reason) of a no-test comment
    while i < len(lines):
        line = lines[i]
        skip = _NO_TEST.match(line)
        if skip:
            pending = (i + 1, skip.group(1))
            i += 1
            continue
        fence = _FENCE.match(line)
        if fence:
            start = i
            i += 1
            while i < len(lines) and lines[i].rstrip() != "```":
                i += 1
            if i == len(lines):
                raise ValueError(f"{rel}:{start + 1}: unclosed code fence")
            reason = None
            if pending is not None and pending[0] == start:
                reason = pending[1]
            elif pending is not None:
                raise ValueError(f"{rel}:{pending[0]}: no-test comment not right before a block")
            pending = None
            code = "\n".join(lines[start + 1 : i]) + "\n"
            blocks.append(Block(rel, start + 1, fence.group(1), code, reason))
        elif pending is not None and line.strip():
            raise ValueError(f"{rel}:{pending[0]}: no-test comment not right before a block")
        i += 1
    return blocks


ALL_BLOCKS = [b for page in PAGES for b in extract_blocks(page)]
RUN_BLOCKS = [b for b in ALL_BLOCKS if b.lang in RUN_LANGS]


class _SharedLLM:
    """A shared engine whose ``shutdown`` is deferred to the end of the module."""

    def __init__(self, llm: Any) -> None:
        self._llm = llm

    def __getattr__(self, name: str) -> Any:
        return getattr(self._llm, name)

    def shutdown(self) -> None:
        pass


_ENGINES: dict[tuple[tuple[str, str], ...], Any] = {}
_NAMESPACES: dict[str, dict[str, Any]] = {}


def _shared_llm(model: str | None = None, **kwargs: Any) -> _SharedLLM:
    import pagedrs
    from pagedrs.engine.arg_utils import EngineArgs
    from pagedrs.engine.llm import LLM

    if model is not None:
        kwargs["model"] = model
    defaults = EngineArgs()
    key = tuple(
        sorted(
            (k, repr(v))
            for k, v in kwargs.items()
            if not (hasattr(defaults, k) and getattr(defaults, k) == v)
        )
    )
    if key not in _ENGINES:
        _ENGINES[key] = LLM(**kwargs)
    assert pagedrs.LLM is _shared_llm
    return _SharedLLM(_ENGINES[key])


@pytest.fixture(scope="module", autouse=True)
def shared_engines() -> Iterator[None]:
    """``pagedrs.LLM`` returns shared engines for the module's duration."""
    import pagedrs

    original = pagedrs.LLM
    pagedrs.LLM = _shared_llm  # type: ignore[assignment,misc]
    try:
        yield
    finally:
        pagedrs.LLM = original  # type: ignore[misc]
        for llm in _ENGINES.values():
            llm.shutdown()
        _ENGINES.clear()


def _run_python(block: Block) -> None:
    ns = _NAMESPACES.setdefault(block.page, {"__name__": "__main__"})
    exec(compile(block.code, block.id, "exec"), ns)  # noqa: S102


def _run_bash(block: Block, capsys: pytest.CaptureFixture[str]) -> None:
    from pagedrs.cli import main

    command = " ".join(line.rstrip("\\").strip() for line in block.code.splitlines())
    for step in (s.strip() for s in command.split("&&")):
        argv = shlex.split(step)
        if argv[:2] == ["pip", "install"]:
            # CI installed the project before the tests; only this project may be named.
            assert all(a == "." or a.startswith(".[") for a in argv[2:]), step
            continue
        assert argv[:1] == ["pagedrs"], (
            f"{block.id}: a bash block runs `pagedrs ...` steps, or carries a "
            f"'<!-- no-test: reason -->' comment: {step!r}"
        )
        assert main(argv[1:]) == 0, f"{block.id}: {step!r} failed"
        out = capsys.readouterr().out
        if argv[1] == "generate":
            prompts = [a for a in argv[2:] if not a.startswith("--")]
            assert out.count("### ") >= len(prompts) - 1, out


@pytest.mark.parametrize("block", RUN_BLOCKS, ids=[b.id for b in RUN_BLOCKS])
def test_doc_block_runs(block: Block, capsys: pytest.CaptureFixture[str]) -> None:
    if block.skip is not None:
        pytest.skip(f"no-test: {block.skip}")
    if block.lang == "python":
        _run_python(block)
    else:
        _run_bash(block, capsys)


def test_every_page_is_scanned() -> None:
    """The site's pages and README hold runnable examples; each no-test comment
    has a reason and marks a block."""
    assert (ROOT / "README.md") in PAGES and len(PAGES) > 5
    run = [b for b in RUN_BLOCKS if b.skip is None]
    skipped = [b for b in RUN_BLOCKS if b.skip is not None]
    assert any(b.page == "README.md" for b in run)
    assert len(run) >= 10, [b.id for b in run]
    for b in skipped:
        assert len(b.skip or "") >= 10, f"{b.id}: give the reason it cannot run"
    assert all(b.lang in RUN_LANGS or b.skip is None for b in ALL_BLOCKS)


def test_readme_test_line_is_ci() -> None:
    """README's "Run the tests" line runs `.ci/run`, which installs the test
    extras, fetches the model files, runs every check and builds the site."""
    readme = [b for b in ALL_BLOCKS if b.page == "README.md" and b.lang == "bash"]
    test_lines = [b.code.strip() for b in readme if ".ci/run" in b.code]
    assert test_lines == ["bash .ci/run"]
    stages = [
        line.split(None, 2)[1:]
        for line in (ROOT / ".ci" / "run").read_text().splitlines()
        if line.startswith("stage ")
    ]
    assert [s[0] for s in stages][:1] == ["install"] and stages[0][1] == 'pip install ".[test]"'
    commands = " && ".join(s[1] for s in stages)
    for part in (
        "ruff check",
        "ruff format --check",
        "cargo clippy --release --workspace",
        "cargo fmt --all --check",
        "mypy.stubtest pagedrs._core",
        "mypy python/pagedrs",
        "pagedrs download --all",
        "cargo test --release --workspace",
    ):
        assert part in commands, part
    assert stages[-1] == ["mkdocs", "mkdocs build --strict"]
