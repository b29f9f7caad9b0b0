"""A sliding-window model (a tiny random Mistral, window 8) generates what HF
transformers' eager attention generates, token for token, from prompts longer
than the window, through the HF model with the paged attention function."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from pagedrs import LLM, SamplingParams
from reference import PROMPTS, hf_greedy
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

WINDOW, NEW_TOKENS = 8, 24


@pytest.fixture(scope="module")
def mistral_dir(tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path) -> Path:
    folder = tmp_path_factory.mktemp("tiny-mistral-window")
    torch.manual_seed(0)
    config = AutoConfig.for_model(
        "mistral",
        vocab_size=49152,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        sliding_window=WINDOW,
        initializer_range=0.5,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(default_model_dir).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def eager_reference(mistral_dir: Path) -> list[list[int]]:
    assert AutoConfig.from_pretrained(mistral_dir).sliding_window == WINDOW
    return hf_greedy(mistral_dir, PROMPTS, NEW_TOKENS, attn_implementation="eager")


@pytest.mark.parametrize("backend", ["torch", "cpu"])
def test_windowed_model_matches_hf_eager(mistral_dir: Path, eager_reference, backend: str):
    llm = LLM(str(mistral_dir), block_size=4, attention_backend=backend)
    assert llm.llm_engine.engine_core.runner.attention.name == backend
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0)
    outs = llm.generate(PROMPTS, params)
    assert [o.outputs[0].token_ids for o in outs] == eager_reference
    # Most prompts and every output run past the window.
    assert sum(len(o.prompt_token_ids) > WINDOW for o in outs) >= 4


def test_window_matters(mistral_dir: Path, eager_reference) -> None:
    """The same weights without the window generate something else, so the
    test above sees the window."""
    full = hf_greedy(
        mistral_dir, PROMPTS, NEW_TOKENS, attn_implementation="eager", sliding_window=None
    )
    assert sum(f != ref for f, ref in zip(full, eager_reference, strict=True)) > 0
