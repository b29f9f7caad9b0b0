"""Greedy outputs equal HF transformers' ``generate`` token for token (float32, CPU),
with all prompts batched together, across block sizes and under preemption."""

from __future__ import annotations

from pathlib import Path

import pytest
from pagedrs import LLM, SamplingParams
from reference import PROMPTS


def _generate(llm: LLM, max_tokens: int) -> list[list[int]]:
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=max_tokens, temperature=0.0))
    return [o.outputs[0].token_ids for o in outs]


def _assert_all_free(llm: LLM) -> None:
    stats = llm.kv_cache_stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"]
    assert stats["num_running"] == stats["num_waiting"] == 0


def test_default_model_matches_hf(default_model_dir: Path, default_reference) -> None:
    llm = LLM(str(default_model_dir), block_size=16)
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=32, temperature=0.0))
    assert [o.outputs[0].token_ids for o in outs] == default_reference
    tok = llm.get_tokenizer()
    for o, ref in zip(outs, default_reference, strict=True):
        assert o.outputs[0].text == tok.decode(ref, skip_special_tokens=True)
        assert o.outputs[0].finish_reason == ("stop" if ref[-1] == 2 else "length")
        assert o.prompt_token_ids == tok(o.prompt).input_ids
    _assert_all_free(llm)


def test_default_model_alias_and_preemption() -> None:
    """The alias runs its GGUF file kept quantized with a bfloat16 KV cache;
    preempted and recomputed, it gives what the same file gives with room for
    every sequence (the quantized projections' bits depend on the row alone)."""
    from pagedrs.executor.model_registry import fetch_gguf

    # 8 prompts of up to ~60 + 32 tokens in a 256-token KV cache: must preempt.
    llm = LLM("smollm2-135m-instruct", num_gpu_blocks_override=16, max_model_len=256)
    args = llm.llm_engine.args
    assert args.cache_dtype().name == "bfloat16"
    got = _generate(llm, 32)
    assert llm.kv_cache_stats()["num_preemptions"] > 0
    _assert_all_free(llm)
    roomy = LLM(str(fetch_gguf("smollm2-135m-instruct")), max_model_len=256)
    assert _generate(roomy, 32) == got
    assert roomy.kv_cache_stats()["num_preemptions"] == 0


@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_tiny_model_matches_hf(tiny_model_dir: Path, tiny_reference, block_size: int) -> None:
    llm = LLM(str(tiny_model_dir), block_size=block_size)
    assert _generate(llm, 40) == tiny_reference
    _assert_all_free(llm)


@pytest.mark.parametrize("block_size", [8, 32])
def test_tiny_model_preempted_by_kv_budget(
    tiny_model_dir: Path, tiny_reference, block_size: int
) -> None:
    llm = LLM(str(tiny_model_dir), block_size=block_size, max_model_len=128)
    per_block = llm.kv_cache_stats()["bytes_per_block"]
    # Room for 128 tokens only: far less than 8 prompts x (prompt + 40) tokens.
    llm = LLM(
        str(tiny_model_dir),
        block_size=block_size,
        max_model_len=128,
        kv_cache_memory_bytes=per_block * (128 // block_size),
    )
    assert llm.kv_cache_stats()["num_total_blocks"] == 128 // block_size
    assert _generate(llm, 40) == tiny_reference
    assert llm.kv_cache_stats()["num_preemptions"] > 0
    _assert_all_free(llm)


def test_chunked_prefill_and_small_batches_match(tiny_model_dir: Path, tiny_reference) -> None:
    # A token budget of 7 splits every long prompt into chunks; 3 seqs at most.
    llm = LLM(str(tiny_model_dir), max_num_batched_tokens=7, max_num_seqs=3)
    assert _generate(llm, 40) == tiny_reference
    _assert_all_free(llm)


def test_triton_backend_matches_torch_backend(tiny_model_dir: Path) -> None:
    # The engine end to end on the Triton kernels (interpreter on CPU): a batch
    # mixing prefill and decode, block size 8 so prompts span several blocks.
    prompts = PROMPTS[:3]
    params = SamplingParams(max_tokens=6, temperature=0.0)
    ref = LLM(str(tiny_model_dir), block_size=8, max_model_len=128, attention_backend="torch")
    tri = LLM(str(tiny_model_dir), block_size=8, max_model_len=128, attention_backend="triton")
    want = [o.outputs[0].token_ids for o in ref.generate(prompts, params)]
    got = [o.outputs[0].token_ids for o in tri.generate(prompts, params)]
    assert got == want
    _assert_all_free(tri)


@pytest.mark.parametrize("model_impl", ["pagedrs", "transformers"])
def test_torch_reference_attention_matches_hf(
    tiny_model_dir: Path, tiny_reference, model_impl: str
) -> None:
    # attention_backend="torch" runs the plain torch path instead of the Rust kernels.
    llm = LLM(str(tiny_model_dir), attention_backend="torch", model_impl=model_impl)
    assert llm.llm_engine.engine_core.runner.attention.name == "torch"
    assert _generate(llm, 40) == tiny_reference
    _assert_all_free(llm)
