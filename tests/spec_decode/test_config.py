"""``speculative_config``: vLLM's field names on ``EngineArgs`` and
``--speculative-config``; a bad value is a ``ValueError`` naming its field;
methods that need trained heads are refused by name; ``draft_model`` needs
its ``model`` and ``num_speculative_tokens`` (the draft model's own checks:
``test_draft_model.py``)."""

from __future__ import annotations

import argparse

import pytest
from pagedrs.engine.arg_utils import EngineArgs
from pagedrs.entrypoints.openai.cli_args import add_serve_args

SC = r"speculative_config"
BAD = [
    (
        {"method": "ngram", "num_speculative_tokens": 0},
        SC + r"\.num_speculative_tokens must be >= 1",
    ),
    (
        {"method": "ngram", "prompt_lookup_min": 5, "prompt_lookup_max": 2},
        SC + r"\.prompt_lookup_min must be <= prompt_lookup_max",
    ),
    (
        {"method": "ngram", "prompt_lookup_max": "four"},
        SC + r"\.prompt_lookup_max must be an integer",
    ),
    (
        {"method": "suffix", "suffix_decoding_min_token_prob": 2.0},
        SC + r"\.suffix_decoding_min_token_prob must be in \[0, 1\]",
    ),
    ({"method": "lookahead"}, SC + r"\.method must be 'ngram', 'suffix' or 'draft_model'"),
    ({"num_speculative_tokens": 3}, SC + r"\.method is required"),
    ({"method": "ngram", "bogus": 1}, SC + r' has an unknown field "bogus"'),
    ({"method": "draft_model", "num_speculative_tokens": 3}, SC + r"\.model is required"),
    (
        {"method": "draft_model", "model": 7, "num_speculative_tokens": 3},
        SC + r"\.model is required",
    ),
    ({"method": "draft_model", "model": "tiny"}, SC + r"\.num_speculative_tokens is required"),
    (
        {"method": "draft_model", "model": "tiny", "num_speculative_tokens": 0},
        SC + r"\.num_speculative_tokens must be >= 1",
    ),
    (
        {"method": "draft_model", "model": "tiny", "num_speculative_tokens": -2},
        SC + r"\.num_speculative_tokens must be >= 0",
    ),
    ({"method": "eagle"}, SC + r"\.method 'eagle' is not built"),
    ({"method": "ngram", "model": "tiny"}, SC + r"\.model .* is not supported"),
    (
        {"method": "ngram", "draft_length_policy": "sometimes"},
        SC + r"\.draft_length_policy must be 'goodput' or 'fixed'",
    ),
    (
        {"method": "ngram", "draft_step_costs": [[1, 0.01]]},
        SC + r"\.draft_step_costs must be a list of \[batch, decode_s, draft_s\] points",
    ),
    (
        {"method": "ngram", "draft_step_costs": "fast"},
        SC + r"\.draft_step_costs must be a list of \[batch, decode_s, draft_s\] points",
    ),
    (
        {"method": "ngram", "draft_step_costs": [[4, 0.01, 0.0], [2, 0.02, 0.0]]},
        SC + r"\.draft_step_costs point 1: batch sizes must increase from 1 up",
    ),
    (
        {"method": "ngram", "draft_step_costs": [[1, -0.01, 0.0]]},
        SC + r"\.draft_step_costs point 0: decode_s must be a positive number",
    ),
    (
        {"method": "ngram", "draft_step_costs": []},
        SC + r"\.draft_step_costs must hold at least one",
    ),
    (
        {"method": "ngram", "draft_length_policy": "fixed", "draft_step_costs": [[1, 0.01, 0]]},
        SC + r"\.draft_step_costs is used by draft_length_policy 'goodput' only",
    ),
    ("{not json", SC + r" is not valid JSON"),
    ("[1, 2]", SC + r" must be a JSON object"),
]


@pytest.mark.parametrize(("config", "match"), BAD)
def test_bad_values_name_the_field(config: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        EngineArgs(speculative_config=config)  # type: ignore[arg-type]


def test_defaults_and_json_flag() -> None:
    cfg = EngineArgs(speculative_config={"method": "ngram"}).speculative()
    assert cfg is not None
    assert (cfg["num_speculative_tokens"], cfg["prompt_lookup_min"], cfg["prompt_lookup_max"]) == (
        5,
        5,
        5,
    )
    assert (cfg["draft_length_policy"], cfg["draft_step_costs"]) == ("goodput", None)
    given = EngineArgs(
        speculative_config={"method": "ngram", "draft_step_costs": [[1, 0.01, 0.001], [8, 0.05, 0]]}
    ).speculative()
    assert given is not None
    assert given["draft_step_costs"] == [(1, 0.01, 0.001), (8, 0.05, 0.0)]
    assert EngineArgs().speculative() is None
    suffix = EngineArgs(speculative_config='{"method": "suffix"}').speculative()
    assert suffix is not None and suffix["num_speculative_tokens"] == 24
    parser = add_serve_args(argparse.ArgumentParser())
    ns = parser.parse_args(
        ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}']
    )
    args = EngineArgs.from_cli_args(ns)
    spec = args.speculative()
    assert spec is not None and spec["num_speculative_tokens"] == 3
