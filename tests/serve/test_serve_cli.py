"""``pagedrs serve``'s data-parallel flags (parsing only: nothing starts)."""

from __future__ import annotations

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
