"""Packed projections replace the plain weights (``executor/models/linear.py``):
the native model holds one copy of each packed projection, and what the plain
weights served keeps working on the same numbers: HF's modules (forward,
``weight``), ``state_dict`` / ``load_state_dict``, tensor-parallel sharding,
a tied LM head's embeddings, and the weight bytes the engine reports.

oneDNN packs bfloat16 only on CPUs with AVX-512 BW/VL/DQ or AVX-NE-CONVERT;
its float32 packing (the same ops, ``mkldnn._reorder_linear_weight`` /
``_linear_pointwise``) runs on any x86 CPU, so the tests run with float32
weights and ``can_pack`` accepting them ("float32-packed"), and with real
bfloat16 packing where this CPU has it."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from pagedrs.executor.models import linear as linear_mod
from pagedrs.executor.models.linear import Linear, PackedRows
from pagedrs.executor.models.llama import PagedLlamaModel
from pagedrs.executor.quant.memory import weight_nbytes
from transformers import AutoModelForCausalLM

BF16_PACKS = linear_mod.can_pack(torch.zeros(2, 2, dtype=torch.bfloat16))


@pytest.fixture(params=["float32-packed", "bfloat16"])
def dtype(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> torch.dtype:
    if request.param == "bfloat16":
        if not BF16_PACKS:
            pytest.skip("oneDNN does not pack bfloat16 on this CPU")
        return torch.bfloat16
    real = linear_mod.can_pack

    def f32_too(weight: torch.Tensor) -> bool:
        return weight.device.type == "cpu" and (weight.dtype == torch.float32 or bool(real(weight)))

    monkeypatch.setattr(linear_mod, "can_pack", f32_too)
    return torch.float32


def _load(folder: Path, dtype: torch.dtype, **kw: object) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, **kw).eval()


def test_packed_weights_replace_the_plain_ones(tiny_model_dir: Path, dtype: torch.dtype) -> None:
    hf = _load(tiny_model_dir, dtype)
    reference = copy.deepcopy(hf)
    want = {k: v.clone() for k, v in hf.state_dict().items()}
    native = PagedLlamaModel(hf, max_positions=64)
    for layer in native.layers:
        for lin in (layer.qkv, layer.o_proj, layer.gate_up, layer.down_proj):
            assert isinstance(lin, Linear) and lin.packed is not None and lin.weight is None
        assert layer.qkv_weight is None and layer.gate_up_weight is None
    assert isinstance(native.lm_head, Linear) and native.lm_head.weight is None  # untied
    # No plain projection weight is left: only the embeddings and norms.
    big = [n for n, p in hf.named_parameters() if p.dim() > 1]
    assert big == ["model.embed_tokens.weight"]
    attn = hf.model.layers[1].self_attn
    assert isinstance(attn.k_proj, PackedRows) and isinstance(hf.lm_head, PackedRows)
    # The plain values, on demand; the state dict as it was.
    got = hf.state_dict()
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert torch.equal(got[key], value), key
    # HF's forward on the same numbers: HF's own bits.
    ids = torch.tensor([[1, 5, 42, 7, 99, 3]])
    with torch.no_grad():
        assert torch.equal(hf(ids).logits, reference(ids).logits)
    # The bytes held: the float parameters (no projection) and the packed weights.
    packed = native.packed_weights()
    assert len(packed) == 4 * len(native.layers) + 1
    params = sum(p.numel() * p.element_size() for p in hf.parameters())
    params += sum(b.numel() * b.element_size() for b in hf.buffers())
    values = sum(p.numel() * p.element_size() for p in packed)
    assert weight_nbytes(hf, packed) == params + values


def test_loading_a_state_dict_repacks(tiny_model_dir: Path, dtype: torch.dtype) -> None:
    hf = _load(tiny_model_dir, dtype)
    native = PagedLlamaModel(hf, max_positions=64)
    state = hf.state_dict()
    new_k = torch.randn_like(state["model.layers.0.self_attn.k_proj.weight"])
    state["model.layers.0.self_attn.k_proj.weight"] = new_k
    hf.load_state_dict(state, strict=True)
    attn = hf.model.layers[0].self_attn
    assert torch.equal(attn.k_proj.weight, new_k)
    fused = torch.cat([attn.q_proj.weight, new_k, attn.v_proj.weight])
    x = torch.randn(3, fused.shape[1]).to(dtype)
    tol = {"rtol": 2**-7, "atol": 1e-2} if dtype == torch.bfloat16 else {}
    torch.testing.assert_close(native.layers[0].qkv(x), F.linear(x, fused), **tol)
    bad = dict(state)
    bad["model.layers.0.self_attn.k_proj.weight"] = new_k[:, :8]
    with pytest.raises(RuntimeError, match="size mismatch for model.layers.0.self_attn.k_proj"):
        hf.load_state_dict(bad)


def test_tensor_parallel_sharding_reads_the_packed_rows(
    tiny_model_dir: Path, dtype: torch.dtype
) -> None:
    from pagedrs.distributed.sharding import shard_llama

    hf = _load(tiny_model_dir, dtype)
    want = {k: v.clone() for k, v in hf.state_dict().items()}
    PagedLlamaModel(hf, max_positions=64)
    shard_llama(hf, 1, 2)
    attn = hf.model.layers[0].self_attn
    rows = attn.k_proj.weight.shape[0]  # KV head 1 of 2
    assert torch.equal(attn.k_proj.weight, want["model.layers.0.self_attn.k_proj.weight"][rows:])
    cols = attn.o_proj.weight.shape[1]
    assert torch.equal(attn.o_proj.weight, want["model.layers.0.self_attn.o_proj.weight"][:, cols:])


def test_tied_lm_head_keeps_the_embeddings(tiny_model_dir: Path, dtype: torch.dtype) -> None:
    hf = _load(tiny_model_dir, dtype)
    hf.lm_head.weight = hf.model.embed_tokens.weight  # tied, as SmolLM2's
    native = PagedLlamaModel(hf, max_positions=64)
    assert native.lm_head.packed is not None  # type: ignore[union-attr]
    assert native.lm_head.weight is hf.model.embed_tokens.weight  # type: ignore[union-attr]
    assert hf.lm_head.weight is hf.model.embed_tokens.weight
    ids = torch.tensor([3, 17])
    assert torch.equal(native.embed_tokens(ids), hf.model.embed_tokens.weight[ids])


def test_engine_reports_the_packed_bytes(tiny_model_dir: Path, dtype: torch.dtype) -> None:
    from pagedrs import LLM

    llm = LLM(
        str(tiny_model_dir),
        dtype="float32" if dtype == torch.float32 else "bfloat16",
        max_model_len=64,
        kv_cache_memory_bytes=1 << 22,
    )
    try:
        core = llm.llm_engine.engine_core
        native = core.runner.native
        assert native is not None and native.lm_head.weight is None
        params = sum(p.numel() * p.element_size() for p in core.model.parameters())
        params += sum(b.numel() * b.element_size() for b in core.model.buffers())
        packed = sum(p.numel() * p.element_size() for p in native.packed_weights())
        assert llm.kv_cache_stats()["weight_bytes"] == params + packed
        assert core.runner.lm_head is core.model.get_output_embeddings()
    finally:
        llm.llm_engine.shutdown()
