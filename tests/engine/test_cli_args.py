"""``pagedrs serve`` and ``pagedrs generate`` take a flag for every ``EngineArgs``
field, generated from the dataclass (no model is loaded here)."""

from __future__ import annotations

import argparse
import dataclasses
import typing
from collections.abc import Callable
from typing import Any

import pytest
from pagedrs.cli import add_generate_args, main
from pagedrs.engine.arg_utils import EngineArgs
from pagedrs.entrypoints.openai.cli_args import add_serve_args

FIELDS = dataclasses.fields(EngineArgs)
HINTS = typing.get_type_hints(EngineArgs)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _serve_parser() -> argparse.ArgumentParser:
    return add_serve_args(argparse.ArgumentParser(prog="pagedrs serve"))


def _generate_parser() -> argparse.ArgumentParser:
    return add_generate_args(argparse.ArgumentParser(prog="pagedrs generate"))


def _serve_argv(name: str, words: list[str]) -> list[str]:
    """``pagedrs serve`` arguments setting field ``name`` (``model`` is positional)."""
    return words[1:] if name == "model" else words


def _generate_argv(name: str, words: list[str]) -> list[str]:
    return ["a prompt", *words]


PARSERS: dict[str, tuple[Callable[[], argparse.ArgumentParser], Callable[..., list[str]]]] = {
    "serve": (_serve_parser, _serve_argv),
    "generate": (_generate_parser, _generate_argv),
}


#: Valid values of string fields with a format of their own.
FORMATTED = {
    "kv_events_config": '{"enable_kv_cache_events": true, "publisher": "null"}',
    "speculative_config": '{"method": "ngram", "num_speculative_tokens": 3}',
}


def _non_default(f: dataclasses.Field[Any]) -> tuple[list[str], Any]:
    """Command-line words setting field ``f`` to a valid value other than its
    default, and that value."""
    hint = HINTS[f.name]
    base = next((a for a in typing.get_args(hint) if a is not type(None)), hint)
    flag = _flag(f.name)
    if base is bool:
        value = not f.default
        return [flag if value else "--no-" + flag[2:]], value
    if f.name in EngineArgs.CHOICES:
        value = next(c for c in EngineArgs.CHOICES[f.name] if c != f.default)
        return [flag, value], value
    if base is int:
        value = 7 if f.default is None else f.default + 3
        return [flag, str(value)], value
    if base is float:
        value = 0.5 if f.name == "gpu_memory_utilization" else f.default + 1.5  # in (0, 1]
        return [flag, str(value)], value
    assert base is str, f"{f.name}: no test value for {hint!r}"
    value = FORMATTED.get(f.name, f"some-{f.name}")
    return [flag, value], value


def test_every_field_is_documented() -> None:
    docs = EngineArgs.field_docs()
    assert set(docs) == {f.name for f in FIELDS}
    assert all(docs.values())
    assert docs["attention_backend"].startswith('"auto" (on GPU Triton, on CPU the Rust kernels')
    assert docs["attention_backend"].endswith(
        "A backend that cannot run the KV cache dtype is refused here, naming it."
    )
    assert docs["kv_cache_dtype"].endswith("fp8 128, int8 132.")


@pytest.mark.parametrize("cmd", ["serve", "generate"])
def test_help_lists_every_field(cmd: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([cmd, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for f in FIELDS:
        if cmd == "serve" and f.name == "model":
            assert "[MODEL]" in out
        else:
            assert _flag(f.name) in out, f.name
    assert "--no-enable-prefix-caching" in out
    assert "--no-enable-chunked-prefill" in out
    own = ["--host", "--port", "--api-key", "--served-model-name", "--max-waiting-requests",
           "--torch-threads", "--log-level"] if cmd == "serve" else [
           "--max-tokens", "--temperature", "--top-p", "--top-k", "--chat"]  # fmt: skip
    for flag in own:
        assert flag in out, flag


@pytest.mark.parametrize("cmd", ["serve", "generate"])
def test_help_text_and_defaults_come_from_the_dataclass(cmd: str) -> None:
    parser = PARSERS[cmd][0]()
    docs = EngineArgs.field_docs()
    actions = {a.dest: a for a in parser._actions}
    for f in FIELDS:
        action = actions[f.name]
        assert action.default == f.default, f.name
        assert action.help is not None and action.help.startswith(docs[f.name]), f.name
        if f.name in EngineArgs.CHOICES:
            assert tuple(action.choices or ()) == EngineArgs.CHOICES[f.name], f.name
    assert actions["dtype"].choices == ("auto", "float32", "float", "float16", "half", "bfloat16")
    assert isinstance(actions["enable_prefix_caching"], argparse.BooleanOptionalAction)


@pytest.mark.parametrize("cmd", ["serve", "generate"])
def test_defaults_give_default_engine_args(cmd: str) -> None:
    make, argv = PARSERS[cmd]
    ns = make().parse_args(argv("model", []))
    assert EngineArgs.from_cli_args(ns) == EngineArgs()


@pytest.mark.parametrize("cmd", ["serve", "generate"])
@pytest.mark.parametrize("field", FIELDS, ids=[f.name for f in FIELDS])
def test_each_field_parses(cmd: str, field: dataclasses.Field[Any]) -> None:
    make, argv = PARSERS[cmd]
    words, value = _non_default(field)
    assert value != field.default
    args = EngineArgs.from_cli_args(make().parse_args(argv(field.name, words)))
    got = getattr(args, field.name)
    assert got == value and type(got) is type(value)
    assert args == dataclasses.replace(EngineArgs(), **{field.name: value})


def test_serve_model_is_positional_and_generate_model_a_flag() -> None:
    assert _serve_parser().parse_args(["my-model"]).model == "my-model"
    with pytest.raises(SystemExit):
        _serve_parser().parse_args(["--model", "my-model"])
    ns = _generate_parser().parse_args(["--model", "my-model", "p1", "p2"])
    assert (ns.model, ns.prompts) == ("my-model", ["p1", "p2"])


def test_server_and_sampling_flags_keep_their_defaults() -> None:
    ns = _serve_parser().parse_args([])
    assert (ns.host, ns.port, ns.api_key, ns.served_model_name) == ("127.0.0.1", 8000, None, None)
    assert (ns.max_waiting_requests, ns.torch_threads, ns.log_level) == (1024, None, "info")
    ns = _generate_parser().parse_args(["hi"])
    assert (ns.max_tokens, ns.temperature, ns.top_p, ns.top_k, ns.chat) == (64, 0.0, 1.0, 0, False)


@pytest.mark.parametrize("cmd", ["serve", "generate"])
@pytest.mark.parametrize("field", sorted(EngineArgs.CHOICES))
def test_invalid_choice_is_an_argparse_error(
    cmd: str, field: str, capsys: pytest.CaptureFixture[str]
) -> None:
    make, argv = PARSERS[cmd]
    with pytest.raises(SystemExit) as exc:
        make().parse_args(argv(field, [_flag(field), "bogus"]))
    assert exc.value.code == 2
    assert "invalid choice: 'bogus'" in capsys.readouterr().err


@pytest.mark.parametrize("words", [["--block-size", "x"], ["--swap-space", "lots"]])
def test_wrong_type_is_an_argparse_error(
    words: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        _serve_parser().parse_args(words)
    assert exc.value.code == 2
    assert "invalid" in capsys.readouterr().err


def test_out_of_range_value_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    """A value of the right type but out of range fails in ``EngineArgs`` (exit 2)."""
    assert main(["generate", "--block-size", "0", "hi"]) == 2
    assert "block_size must be >= 1" in capsys.readouterr().err
