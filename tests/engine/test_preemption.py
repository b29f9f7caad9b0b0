"""Preemption by swap and by recompute both give the outputs of an unpreempted
run; a prompt that can never fit fails alone while the others finish."""

from __future__ import annotations

from pathlib import Path

import pytest
from pagedrs import LLM, LLMEngine, SamplingParams
from pagedrs.engine.arg_utils import EngineArgs
from reference import PROMPTS


@pytest.mark.parametrize("mode", ["recompute", "swap"])
@pytest.mark.parametrize("caching", [False, True])
def test_preempted_outputs_equal_hf(
    tiny_model_dir: Path, tiny_reference, mode: str, caching: bool
) -> None:
    llm = LLM(
        str(tiny_model_dir),
        block_size=8,
        max_model_len=128,
        num_gpu_blocks_override=16,
        preemption_mode=mode,
        swap_space=0.01,
        enable_prefix_caching=caching,
    )
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=40, temperature=0.0))
    assert [o.outputs[0].token_ids for o in outs] == tiny_reference
    stats = llm.kv_cache_stats()
    assert stats["num_preemptions"] > 0
    if mode == "swap":
        assert stats["num_swapped_out"] > 0
        assert stats["num_swapped_in"] == stats["num_swapped_out"]
    assert stats["num_free_blocks"] == stats["num_total_blocks"]
    assert stats["num_free_cpu_blocks"] == stats["num_cpu_blocks"]


def test_default_model_swap_matches_hf(default_model_dir: Path, default_reference) -> None:
    llm = LLM(
        str(default_model_dir),
        max_model_len=256,
        num_gpu_blocks_override=16,
        preemption_mode="swap",
        swap_space=0.1,
    )
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=32, temperature=0.0))
    assert [o.outputs[0].token_ids for o in outs] == default_reference
    assert llm.kv_cache_stats()["num_swapped_out"] > 0


def test_prompt_longer_than_kv_cache_fails_alone(tiny_model_dir: Path) -> None:
    engine = LLMEngine(
        EngineArgs(
            model=str(tiny_model_dir), block_size=8, max_model_len=64, num_gpu_blocks_override=8
        )
    )
    params = SamplingParams(max_tokens=5, temperature=0.0)
    engine.add_request("a", "Hello there", params)
    with pytest.raises(ValueError, match="max_model_len"):
        engine.add_request("long", list(range(100, 300)), params)
    engine.add_request("b", "Name three rivers.", params)
    done = []
    while engine.has_unfinished_requests():
        done += [o.request_id for o in engine.step() if o.finished]
    assert sorted(done) == ["a", "b"]
    stats = engine.kv_cache_stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"]


def test_abort_frees_blocks_at_once(tiny_model_dir: Path) -> None:
    engine = LLMEngine(EngineArgs(model=str(tiny_model_dir), block_size=8, max_model_len=128))
    params = SamplingParams(max_tokens=50, temperature=0.0, ignore_eos=True)
    for r in "abc":
        engine.add_request(r, "Tell me a story about a cat.", params)
    engine.step()
    engine.step()
    out = engine.abort_request("b")
    assert out is not None and out.outputs[0].finish_reason == "abort"
    assert engine.abort_request("b") is None
    while engine.has_unfinished_requests():
        engine.step()
    stats = engine.kv_cache_stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"]
