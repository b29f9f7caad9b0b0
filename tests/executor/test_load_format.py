"""``load_format="dummy"``: random weights made from a config-only folder on
the device, the same for the same seed, and run exactly as HF runs them;
the device check's model factory (``benches/gpu_models.py``) builds such
folders."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from pagedrs import LLM, EngineArgs, SamplingParams
from pagedrs.executor.model_loader import dummy_model, load_config, load_model
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benches"))
import gpu_models  # noqa: E402

SMALL = {
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 300,
    "max_position_embeddings": 128,
    "initializer_range": 0.2,  # peaked logits: greedy ties are rare
}


@pytest.fixture(scope="module")
def config_only(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = gpu_models.config_folder("llama3-8b", tmp_path_factory.mktemp("shapes"), **SMALL)
    assert not list(folder.glob("*.safetensors"))
    return folder


def test_dummy_weights_are_seeded_and_on_the_device(config_only: Path) -> None:
    a = load_model(str(config_only), torch.float32, torch.device("cpu"), load_format="dummy")
    b = load_model(str(config_only), torch.float32, torch.device("cpu"), load_format="dummy")
    assert a.config.num_hidden_layers == 2
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(pa, pb), name
    w = a.get_input_embeddings().weight
    assert w.dtype == torch.float32 and float(w.detach().std()) > 0.01  # initialized, not zeros


def test_dummy_model_greedy_equals_hf(config_only: Path) -> None:
    prompts = gpu_models.random_prompts(3, 7, SMALL["vocab_size"], seed=1)
    llm = LLM(str(config_only), load_format="dummy", num_gpu_blocks_override=32, device="cpu")
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    got = [
        o.outputs[0].token_ids
        for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    ]
    config = load_config(config_only)
    weights = dummy_model(config, torch.float32, torch.device("cpu")).state_dict()
    hf = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    hf.load_state_dict(weights)
    for p, tokens in zip(prompts, got, strict=True):
        ids = torch.tensor([p])
        out = hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=6,
            do_sample=False,
            min_new_tokens=6,
            pad_token_id=0,
        )
        assert list(tokens) == out[0, len(p) :].tolist()


def test_load_format_refusals(config_only: Path) -> None:
    with pytest.raises(ValueError, match="load_format must be one of"):
        EngineArgs(model=str(config_only), load_format="safetensors-ish")
    with pytest.raises(ValueError, match="one rank"):
        EngineArgs(model=str(config_only), load_format="dummy", tensor_parallel_size=2)
    with pytest.raises(ValueError, match="load_format must be one of"):
        load_model(str(config_only), torch.float32, torch.device("cpu"), load_format="x")
