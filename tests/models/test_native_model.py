"""pagedrs' own Llama code (executor/models/llama.py) against HF's modules run
through the same paged attention: same logprobs, same tokens, shared weights."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from pagedrs import LLM, SamplingParams
from pagedrs.executor.models import PagedLlamaModel, supports_native
from reference import PROMPTS
from transformers import AutoModelForCausalLM


def _run(model_dir: Path, impl: str, **kwargs) -> list:
    llm = LLM(model=str(model_dir), model_impl=impl, **kwargs)
    assert (llm.llm_engine.engine_core.runner.native is not None) == (impl == "pagedrs")
    params = SamplingParams(max_tokens=12, temperature=0, logprobs=3, prompt_logprobs=3)
    return llm.generate(PROMPTS, params, use_tqdm=False)


#: Two model codes (fused projections vs HF's modules), so not equal bits: the
#: largest |dlogprob| measured on the default model (block_size=8, PROMPTS) was
#: 2.2e-5 on a Zen 4 EPYC (1.7e-5 on a Xeon with AMX, 2 cores); 2e-4 leaves ~9x
#: for other CPUs' float32 rounding.
LOGPROB_TOL = 2e-4


def _assert_same(a: list, b: list) -> None:
    for x, y in zip(a, b, strict=True):
        assert x.outputs[0].token_ids == y.outputs[0].token_ids
        for lx, ly in zip(x.outputs[0].logprobs, y.outputs[0].logprobs, strict=True):
            assert lx.keys() == ly.keys()
            for tok in lx:
                assert lx[tok].logprob == pytest.approx(ly[tok].logprob, abs=LOGPROB_TOL)
        for lx, ly in zip(x.prompt_logprobs[1:], y.prompt_logprobs[1:], strict=True):
            for tok in set(lx) & set(ly):
                assert lx[tok].logprob == pytest.approx(ly[tok].logprob, abs=LOGPROB_TOL)


@pytest.mark.parametrize("chunked", [False, True])
def test_tiny_native_equals_hf_modules(tiny_model_dir: Path, chunked: bool) -> None:
    # A 16-token budget splits prompts into chunks and mixes them with decodes.
    kwargs = {"max_num_batched_tokens": 16} if chunked else {}
    _assert_same(_run(tiny_model_dir, "pagedrs", **kwargs), _run(tiny_model_dir, "transformers"))


def test_default_native_equals_hf_modules(default_model_dir: Path) -> None:
    _assert_same(
        _run(default_model_dir, "pagedrs", block_size=8),
        _run(default_model_dir, "transformers", block_size=8),
    )


def test_weights_are_shared_not_copied(tiny_model_dir: Path) -> None:
    hf = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    native = PagedLlamaModel(hf, max_positions=64)
    attn = hf.model.layers[1].self_attn
    fused = native.layers[1].qkv_weight
    assert attn.q_proj.weight.data_ptr() == fused.data_ptr()
    assert attn.v_proj.weight.untyped_storage().data_ptr() == fused.untyped_storage().data_ptr()
    assert torch.equal(fused[-attn.v_proj.out_features :], attn.v_proj.weight)
    mlp = hf.model.layers[0].mlp
    assert (
        mlp.up_proj.weight.data_ptr()
        == native.layers[0].gate_up_weight[mlp.gate_proj.out_features :].data_ptr()
    )


def test_unsupported_family_falls_back_or_raises(tiny_model_dir: Path, tmp_path: Path) -> None:
    # transformers' own Python formula of GELU (its bits are not torch's).
    folder = tmp_path / "gelu-new-llama"
    shutil.copytree(tiny_model_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    config["hidden_act"] = "gelu_new"
    (folder / "config.json").write_text(json.dumps(config))
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    assert not supports_native(hf)
    with pytest.raises(ValueError, match="no native implementation"):
        LLM(model=str(folder), model_impl="pagedrs")
    llm = LLM(model=str(folder))  # auto: HF's modules
    assert llm.llm_engine.engine_core.runner.native is None
    out = llm.generate(["Hi"], SamplingParams(max_tokens=3, temperature=0), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 3


def test_invalid_model_impl() -> None:
    with pytest.raises(ValueError, match="model_impl"):
        LLM(model_impl="vllm")


@pytest.mark.parametrize("rows", [1, 5, 64, 300])
def test_packed_bfloat16_linear_matches_torch(rows: int) -> None:
    """A bfloat16 projection prepacked for oneDNN computes what ``F.linear``
    and ``torch.addmm`` do: within one bfloat16 rounding of the float32 product
    (the GEMMs may block the sum differently), and float32 weights stay plain."""
    from pagedrs.executor.models.linear import Linear, can_pack

    torch.manual_seed(rows)
    weight = torch.randn(96, 64).bfloat16()
    x = torch.randn(rows, 64).bfloat16()
    residual = torch.randn(rows, 96).bfloat16()
    lin = Linear(weight)
    assert (lin.packed is not None) == can_pack(weight)
    assert Linear(weight.float()).packed is None
    exact = x.float() @ weight.float().t()
    for got, want in ((lin(x), exact), (lin.add_to(residual, x), exact + residual.float())):
        assert got.dtype == torch.bfloat16 and got.shape == (rows, 96)
        torch.testing.assert_close(got.float(), want, rtol=2**-7, atol=1e-2)
    torch.testing.assert_close(lin.add_to(residual, x), torch.addmm(residual, x, weight.t()))


def test_packed_linear_gives_a_lone_row_the_bits_it_has_in_a_batch() -> None:
    """A single row goes through the packed GEMM as two rows, so its bits equal
    those it gets beside any other row (oneDNN's one-row kernel sums some rows
    of a 1,536-input projection differently in the last bit)."""
    from pagedrs.executor.models.linear import Linear, can_pack

    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(576, 1536, generator=gen).bfloat16()
    if not can_pack(weight):
        pytest.skip("no oneDNN bfloat16 packing in this torch build")
    lin = Linear(weight)
    x = torch.randn(24, 1536, generator=gen).bfloat16()
    residual = torch.randn(24, 576, generator=gen).bfloat16()
    for i in range(24):
        pair = [i, (i + 7) % 24]
        assert lin(x[i : i + 1]).shape == (1, 576)
        assert torch.equal(lin(x[i : i + 1])[0], lin(x[pair])[0])
        assert torch.equal(
            lin.add_to(residual[i : i + 1], x[i : i + 1])[0], lin.add_to(residual[pair], x[pair])[0]
        )


def test_bfloat16_native_model_packs_its_projections(tiny_model_dir: Path) -> None:
    from pagedrs.executor.models.linear import onednn_bf16_packing

    hf = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16)
    down = hf.model.layers[0].mlp.down_proj.weight.detach().clone()
    native = PagedLlamaModel(hf, max_positions=64)
    layer = native.layers[0]
    packed = onednn_bf16_packing()  # this CPU and torch pack bfloat16 weights
    for lin in (layer.qkv, layer.o_proj, layer.gate_up, layer.down_proj, native.lm_head):
        assert (lin.packed is not None) == packed
        # A packed projection keeps no plain copy beside the packed one.
        assert (lin.weight is None) == packed or lin is native.lm_head
    assert torch.equal(layer.down_proj.plain_weight(), down)
    hf32 = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    assert PagedLlamaModel(hf32, max_positions=64).layers[0].qkv.packed is None
