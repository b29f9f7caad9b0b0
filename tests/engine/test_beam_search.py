"""Beam search inside the engine equals HF transformers'
``generate(num_beams=k, do_sample=False)`` with the same length penalty and
early stopping; beams share blocks; every block comes back."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from pagedrs import LLM, BeamSearchParams, LLMEngine
from pagedrs.engine.arg_utils import EngineArgs
from reference import hf_beams
from transformers import AutoModelForCausalLM

PROMPTS = ["The capital of France is", "Name three rivers.", "def fib(n):"]


@pytest.fixture(scope="module")
def hf_default(default_model_dir: Path):
    return AutoModelForCausalLM.from_pretrained(default_model_dir, dtype=torch.float32).eval()


@pytest.mark.parametrize(
    ("k", "lp", "early"), [(2, 1.0, False), (4, 1.0, False), (4, 0.5, True), (2, 2.0, "never")]
)
def test_beam_search_matches_hf(default_model_dir: Path, hf_default, k, lp, early) -> None:
    llm = LLM(str(default_model_dir), max_model_len=512)
    tok = llm.get_tokenizer()
    params = BeamSearchParams(beam_width=k, max_tokens=16, length_penalty=lp, early_stopping=early)
    outs = llm.beam_search(PROMPTS, params)
    for prompt, out in zip(PROMPTS, outs, strict=True):
        want = hf_beams(hf_default, tok, prompt, k, 16, lp, early)
        assert [c.token_ids for c in out.outputs] == want
        assert out.outputs[0].text == tok.decode(want[0], skip_special_tokens=True)
    stats = llm.kv_cache_stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"]


def test_beams_share_blocks(tiny_model_dir: Path) -> None:
    engine = LLMEngine(
        EngineArgs(
            model=str(tiny_model_dir), block_size=16, max_model_len=256, enable_prefix_caching=False
        )
    )
    engine.add_beam_search_request("b", list(range(600, 640)), BeamSearchParams(4, max_tokens=8))
    engine.step()  # prefill: 3 blocks (the last partial), then 4 beams forked from it
    assert engine.kv_cache_stats()["num_used_blocks"] == 3
    while engine.has_unfinished_requests():
        engine.step()
        # The 2 full prompt blocks stay shared; each beam owns at most its
        # last (copied-on-write) block: never 4 x 3 blocks.
        assert engine.kv_cache_stats()["num_used_blocks"] <= 2 + 4
    stats = engine.kv_cache_stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"]


def test_beam_search_under_preemption_matches_unpreempted(tiny_model_dir: Path) -> None:
    params = BeamSearchParams(beam_width=3, max_tokens=24, ignore_eos=True)
    prompts = ["Once upon a time", "The sky is blue and", "Numbers: 1 2 3"]
    # Batch-invariant projections: preemption changes each step's batch, and
    # beam ranking compares float sums.
    roomy = LLM(str(tiny_model_dir), block_size=8, max_model_len=64, batch_invariant=True)
    want = [[c.token_ids for c in o.outputs] for o in roomy.beam_search(prompts, params)]
    tight = LLM(
        str(tiny_model_dir),
        block_size=8,
        max_model_len=64,
        num_gpu_blocks_override=12,
        batch_invariant=True,
    )
    got = [[c.token_ids for c in o.outputs] for o in tight.beam_search(prompts, params)]
    assert got == want
    stats = tight.kv_cache_stats()
    assert stats["num_preemptions"] > 0
    assert stats["num_free_blocks"] == stats["num_total_blocks"]


def test_beam_search_abort_frees_every_beam(tiny_model_dir: Path) -> None:
    engine = LLMEngine(EngineArgs(model=str(tiny_model_dir), max_model_len=256))
    engine.add_beam_search_request("b", "Hello there", BeamSearchParams(4, max_tokens=30))
    for _ in range(3):
        engine.step()
    assert engine.abort_request("b") is not None
    assert not engine.has_unfinished_requests()
    stats = engine.kv_cache_stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"beam_width": 0}, "beam_width"),
        ({"beam_width": 2, "max_tokens": 0}, "max_tokens"),
        ({"beam_width": 2, "early_stopping": "sometimes"}, "early_stopping"),
        ({"beam_width": 2, "length_penalty": float("inf")}, "length_penalty"),
    ],
)
def test_invalid_beam_params(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        BeamSearchParams(**kwargs)
