"""Beam search with a LoRA adapter: every beam runs the adapter (forks
inherit it), the beams equal HF's beam search on the PEFT model, a search of
the base model beside it is unchanged, and the adapter is unpinned when the
search ends or is aborted."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from lora_models import ADAPTERS, build_base, make_adapter, peft
from pagedrs import LLM, BeamSearchParams, LoRARequest
from reference import hf_beams
from transformers import AutoModelForCausalLM, AutoTokenizer

PROMPTS = ["The capital of France is", "Name three rivers."]
PARAMS = BeamSearchParams(beam_width=3, max_tokens=12)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path):
    root = tmp_path_factory.mktemp("lora-beams")
    base = build_base("llama", root / "base", default_model_dir)
    adapter = make_adapter(base, root / "a", 3, **ADAPTERS["all-r16"])
    llm = LLM(str(base), enable_lora=True, max_loras=2, max_lora_rank=16, max_model_len=128)
    return base, adapter, llm


def _hf(base: Path, adapter: Path | None) -> list[list[list[int]]]:
    tok = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(
        base, dtype=torch.float32, attn_implementation="eager"
    )
    if adapter is not None:
        model = peft.PeftModel.from_pretrained(model, adapter)
    model.eval()
    with torch.no_grad():
        return [hf_beams(model, tok, p, PARAMS.beam_width, PARAMS.max_tokens) for p in PROMPTS]


def test_beams_run_the_adapter_as_peft_does(setup) -> None:
    base, adapter, llm = setup
    lora = LoRARequest("a", 1, str(adapter))
    prompts = PROMPTS * 2
    per_prompt = [lora, lora, None, None]
    outs = llm.beam_search(prompts, PARAMS, use_tqdm=False, lora_request=per_prompt)
    got = [[c.token_ids for c in o.outputs] for o in outs]
    assert got[:2] == _hf(base, adapter)
    assert got[2:] == _hf(base, None)
    assert got[:2] != got[2:]
    manager = llm.llm_engine.engine_core.lora
    assert manager._request_lora == {}, "every search unpinned its adapter"
    assert manager.registry.unload(1), "an idle adapter unloads"
    stats = llm.kv_cache_stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"]


def test_an_aborted_search_unpins_its_adapter(setup) -> None:
    _, adapter, llm = setup
    engine = llm.llm_engine
    lora = LoRARequest("b", 2, str(adapter))
    engine.add_beam_search_request("beam", "Once upon a time", PARAMS, lora_request=lora)
    engine.step()
    engine.step()
    manager = engine.engine_core.lora
    assert manager._request_lora == {"beam": 2}
    assert engine.engine_core.last_batch.seq_lora_ids.tolist() == [2] * PARAMS.beam_width
    engine.abort_request("beam")
    assert manager._request_lora == {}
    assert not engine.has_unfinished_requests()
