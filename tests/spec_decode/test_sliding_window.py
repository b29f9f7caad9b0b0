"""A sliding-window model (a tiny random Mistral, window 8, blocks of 4) with
every projection, the LM head included, on the int8 Rust kernels (batch
invariant): greedy outputs with speculation equal those without it, with the
window releasing blocks behind verified tokens only."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from pagedrs import LLM, SamplingParams
from pagedrs.executor.quant import int8
from pagedrs.executor.quant.modules import QuantizedLinearModule
from spec_engines import PROMPTS, SUFFIX
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

WINDOW = 8


@pytest.fixture(scope="module")
def mistral_dir(tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path) -> Path:
    folder = tmp_path_factory.mktemp("tiny-mistral-window-spec")
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


@pytest.fixture
def int8_lm_head(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``quantization="int8"`` quantizes the LM head too (it keeps it float
    otherwise, as vLLM), so that no float projection is left."""
    inner = int8.quantize_model_int8

    def quantize(model: torch.nn.Module) -> int:
        count = inner(model)
        head = model.get_output_embeddings()
        model.lm_head = QuantizedLinearModule(int8.quantize_int8(head.weight), None)
        return count + 1

    monkeypatch.setattr(int8, "quantize_model_int8", quantize)
    yield


def test_windowed_model_equal_on_and_off(mistral_dir: Path, int8_lm_head: None) -> None:
    kw = {"block_size": 4, "quantization": "int8", "kv_cache_memory_bytes": 16 << 20}
    params = SamplingParams(max_tokens=40, temperature=0.0, logprobs=1)
    outs = {}
    for name, cfg in (("off", None), ("suffix", SUFFIX)):
        llm = LLM(str(mistral_dir), speculative_config=cfg, **kw)
        assert isinstance(llm.llm_engine.engine_core.model.lm_head, QuantizedLinearModule)
        outs[name] = llm.generate(PROMPTS, params, use_tqdm=False)
        if cfg is not None:
            # Again: the suffix tree of earlier outputs drafts them, across
            # windows, so most drafts are accepted.
            outs["again"] = llm.generate(PROMPTS, params, use_tqdm=False)
        stats = llm.llm_engine.kv_cache_stats()
        assert stats["num_used_blocks"] == 0
        if cfg is not None:
            assert stats["spec_decode_num_accepted_tokens"] > 0
        llm.llm_engine.shutdown()
    for a, b, c in zip(outs["off"], outs["suffix"], outs["again"], strict=True):
        assert a.outputs[0].token_ids == c.outputs[0].token_ids
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert [list(p.items()) for p in a.outputs[0].logprobs] == [
            list(p.items()) for p in b.outputs[0].logprobs
        ]
    assert sum(len(o.prompt_token_ids) + 40 > WINDOW for o in outs["off"]) == len(PROMPTS)
