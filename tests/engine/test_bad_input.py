"""Bad input raises a clear error, queues nothing, and leaves the engine usable."""

from __future__ import annotations

from pathlib import Path

import pytest
from pagedrs import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm(tiny_model_dir: Path) -> LLM:
    return LLM(str(tiny_model_dir), max_model_len=64)


def _assert_usable(llm: LLM) -> None:
    stats = llm.kv_cache_stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"]
    assert stats["num_waiting"] == stats["num_running"] == 0
    out = llm.generate(["Hello there"], SamplingParams(max_tokens=3, temperature=0.0))
    assert len(out[0].outputs[0].token_ids) >= 1


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": -3}, "max_tokens"),
        ({"temperature": -0.5}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": "0.5"}, "temperature must be a finite number"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"min_tokens": 5, "max_tokens": 2}, "min_tokens"),
        ({"seed": -1}, "seed"),
        ({"stop_token_ids": [-4]}, "stop_token_ids"),
    ],
)
def test_invalid_sampling_params(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_empty_prompt_list(llm: LLM) -> None:
    with pytest.raises(ValueError, match="empty"):
        llm.generate([])
    _assert_usable(llm)


def test_empty_prompt_in_a_batch_queues_nothing(llm: LLM) -> None:
    with pytest.raises(ValueError, match="empty"):
        llm.generate(["fine prompt", ""])
    with pytest.raises(ValueError, match="empty"):
        llm.generate([{"prompt_token_ids": []}])
    _assert_usable(llm)


def test_prompt_longer_than_max_model_len(llm: LLM) -> None:
    with pytest.raises(ValueError, match="max_model_len"):
        llm.generate(["short", "word " * 200])
    _assert_usable(llm)


def test_token_ids_outside_vocabulary(llm: LLM) -> None:
    with pytest.raises(
        ValueError, match=r"token ids must be in \[0, \d+\), got 1000000 at position 2"
    ):
        llm.generate([[1, 2, 10**6]])
    with pytest.raises(ValueError, match=r"^prompt 1: .*got -4 at position 0"):
        llm.generate([[1, 2], [-4, 5]])
    _assert_usable(llm)


def test_params_list_of_wrong_length(llm: LLM) -> None:
    with pytest.raises(ValueError, match="sampling params"):
        llm.generate(["a", "b"], [SamplingParams()])
    _assert_usable(llm)


def test_max_model_len_caps_generation(llm: LLM) -> None:
    out = llm.generate(["Hi"], SamplingParams(max_tokens=500, temperature=0.0, ignore_eos=True))
    c = out[0].outputs[0]
    assert c.finish_reason == "length"
    assert len(out[0].prompt_token_ids) + len(c.token_ids) == 64
    _assert_usable(llm)


def test_unknown_model_name() -> None:
    with pytest.raises(ValueError, match="unknown model"):
        LLM("no-such-model-anywhere")


def test_missing_model_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown model"):
        LLM(str(tmp_path / "missing.gguf"))


def test_kv_budget_below_one_sequence(tiny_model_dir: Path) -> None:
    with pytest.raises(ValueError, match="max_model_len"):
        LLM(str(tiny_model_dir), max_model_len=128, num_gpu_blocks_override=2)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"block_size": 0},
        {"max_num_seqs": 0},
        {"dtype": "int8"},
        {"preemption_mode": "teleport"},
        {"seed": "x"},
        {"tensor_parallel_size": 0},
        {"max_model_len": 10**6},
    ],
)
def test_invalid_engine_args(tiny_model_dir: Path, kwargs: dict) -> None:
    with pytest.raises(ValueError):
        LLM(str(tiny_model_dir), **kwargs)


def test_more_bad_inputs_are_clear_errors(llm: LLM) -> None:
    with pytest.raises(ValueError, match="max_logprobs"):
        llm.generate(["Hi"], SamplingParams(logprobs=10**6, max_tokens=2))
    with pytest.raises(ValueError, match="ignore_eos"):
        SamplingParams(ignore_eos="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="sampling_params"):
        llm.generate(["Hi"], {"max_tokens": 3})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="prompts"):
        llm.generate(None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="content"):
        llm.chat([{"role": "user", "content": None}])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="content"):
        llm.chat([{"role": "user"}])
    _assert_usable(llm)


def test_max_logprobs_minus_one_means_no_limit() -> None:
    from pagedrs import EngineArgs

    assert EngineArgs(max_logprobs=-1).max_logprobs == -1
    with pytest.raises(ValueError, match="max_logprobs must be >= -1"):
        EngineArgs(max_logprobs=-2)
