"""``pagedrs serve``'s data-parallel flags and its ``--ray`` branch (parsing and
dispatch only: nothing starts)."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest
from pagedrs.cli import build_parser, main
from pagedrs.serve.app import ROUTERS


def test_flags_parse() -> None:
    ns = build_parser().parse_args(
        ["serve", "m", "--ray", "--data-parallel-size", "2", "--request-router", "round_robin"]
    )
    assert (ns.ray, ns.data_parallel_size, ns.request_router) == (True, 2, "round_robin")
    ns = build_parser().parse_args(["serve", "m"])
    assert (ns.ray, ns.data_parallel_size, ns.request_router) == (False, 1, "pagedrs")
    assert ns.data_parallel_rank is None  # an engine argument, set per replica


def test_router_choices_are_the_known_routers() -> None:
    parser = build_parser()
    for name in ROUTERS:
        assert parser.parse_args(["serve", "--request-router", name]).request_router == name
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--request-router", "nope"])
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--data-parallel-size", "0"])


def test_data_parallel_needs_ray(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "m", "--data-parallel-size", "2"]) == 2
    assert "--data-parallel-size > 1 needs --ray" in capsys.readouterr().err


def test_data_parallel_rank_is_checked() -> None:
    from pagedrs import EngineArgs

    assert EngineArgs(data_parallel_rank=1).data_parallel_rank == 1
    with pytest.raises(ValueError, match="data_parallel_rank must be >= 0"):
        EngineArgs(data_parallel_rank=-1)
    with pytest.raises(ValueError, match="data_parallel_rank must be an integer"):
        EngineArgs(data_parallel_rank="0")  # type: ignore[arg-type]


def test_ray_branch_is_the_cli_s(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--ray`` goes to ``serve.app.run_ray_server``, without it to the server's
    ``run_server``; each sees the parsed arguments."""
    import pagedrs.entrypoints.openai.api_server as api_server
    import pagedrs.serve.app as serve_app

    calls: list[tuple[str, argparse.Namespace]] = []
    monkeypatch.setattr(serve_app, "run_ray_server", lambda ns: calls.append(("ray", ns)) or 0)
    monkeypatch.setattr(api_server, "run_server", lambda ns: calls.append(("server", ns)) or 0)
    assert main(["serve", "m", "--ray", "--data-parallel-size", "2"]) == 0
    assert main(["serve", "m"]) == 0
    assert [(w, ns.ray, ns.data_parallel_size) for w, ns in calls] == [
        ("ray", True, 2),
        ("server", False, 1),
    ]


def test_bad_chat_options_fail_before_either_branch(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import pagedrs.serve.app as serve_app

    monkeypatch.setattr(serve_app, "run_ray_server", lambda ns: pytest.fail("started"))
    assert main(["serve", "m", "--ray", "--enable-auto-tool-choice"]) == 2
    assert "--enable-auto-tool-choice needs --tool-call-parser" in capsys.readouterr().err


def test_run_server_serves_one_engine() -> None:
    from pagedrs.entrypoints.openai.api_server import run_server

    for argv in (["serve", "m", "--ray"], ["serve", "m", "--ray", "--data-parallel-size", "2"]):
        with pytest.raises(ValueError, match="--ray"):
            run_server(build_parser().parse_args(argv))


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)


@pytest.mark.parametrize(
    "modules",
    [
        ("pagedrs.entrypoints.openai.api_server", "pagedrs.serve.app", "pagedrs.cli"),
        ("pagedrs.serve.app", "pagedrs.entrypoints.openai.api_server", "pagedrs.cli"),
        ("pagedrs.cli", "pagedrs.serve.app", "pagedrs.entrypoints.openai.api_server"),
    ],
    ids=["server first", "serve first", "cli first"],
)
def test_server_and_serve_import_in_any_order(modules: tuple[str, ...]) -> None:
    """No import cycle: each order imports in a fresh interpreter."""
    proc = _python("".join(f"import {m}\n" for m in modules))
    assert proc.returncode == 0, proc.stderr


def test_server_does_not_import_serve() -> None:
    proc = _python(
        "import sys\n"
        "import pagedrs.entrypoints.openai.api_server\n"
        "print(sorted(m for m in sys.modules if m.startswith('pagedrs.serve')))\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
