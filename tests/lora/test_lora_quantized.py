"""LoRA beside a GGUF-quantized base projection: the wrapper adds exactly the
adapter's product to the quantized kernel's output, and a batch mixing an
adapter and the base gives each request what it gets alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from lora_models import make_adapter
from lora_reference import lora_add_reference
from pagedrs import LLM, LoRARequest, SamplingParams
from pagedrs.executor.quant.linear import QuantizedLinear

SMOL = Path.home() / ".cache" / "pagedrs" / "gguf" / "SmolLM2-135M-Instruct.Q4_1.gguf"
pytestmark = pytest.mark.skipif(not SMOL.exists(), reason="SmolLM2 GGUF not cached")


@pytest.fixture(scope="module")
def engine_and_adapter(tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path):
    folder = make_adapter(
        default_model_dir,
        tmp_path_factory.mktemp("gguf-lora") / "a",
        3,
        r=8,
        lora_alpha=16,
        target_modules=["q_proj", "v_proj", "down_proj"],
    )
    llm = LLM(
        str(SMOL),
        enable_lora=True,
        max_lora_rank=8,
        max_model_len=256,
        num_gpu_blocks_override=64,
    )
    return llm, LoRARequest("a", 1, str(folder))


def test_product_is_added_beside_the_quantized_kernel(engine_and_adapter) -> None:
    llm, lora = engine_and_adapter
    core = llm.llm_engine.engine_core
    core.lora.registry.load(lora)
    layer = core.runner.native.layers[0]
    assert isinstance(layer.qkv.base, QuantizedLinear)
    adapter = core.lora.registry.get(1)
    core.lora._fill(0, 1)
    x = torch.randn(5, 576)
    slots = np.array([0, -1, 0, 0, -1], dtype=np.int32)
    core.lora.step.slots = slots
    try:
        got = layer.qkv(x)
    finally:
        core.lora.clear_step()
    want = layer.qkv.base(x).double()
    for name, col in (("q_proj", 0), ("v_proj", 576 + 192)):
        w = adapter.weights[(0, name)]
        a = w.lora_a[None].double()
        b = w.lora_b[None].double()
        ranks = np.array([8], np.int32)
        scal = np.array([adapter.scaling], np.float32)
        lora_add_reference(x.double(), want, slots, a, b, ranks, scal, out_col=col)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-4)
    assert torch.equal(got[1], layer.qkv.base(x)[1]), "base rows untouched"


def test_mixed_batch_on_quantized_weights(engine_and_adapter) -> None:
    llm, lora = engine_and_adapter
    params = SamplingParams(max_tokens=8, temperature=0.0, logprobs=0)
    prompts = ["The capital of France is", "Name three rivers."]
    per = [lora, None, None, lora]
    mixed = llm.generate(prompts * 2, params, use_tqdm=False, lora_request=per)
    for prompt, lr, out in zip(prompts * 2, per, mixed, strict=True):
        llm.reset_prefix_cache()
        alone = llm.generate(prompt, params, use_tqdm=False, lora_request=lr)[0].outputs[0]
        assert out.outputs[0].token_ids == alone.token_ids
    base = llm.generate(prompts[0], params, use_tqdm=False)[0].outputs[0].token_ids
    assert mixed[0].outputs[0].token_ids != base
