"""The native models' elementwise pieces (``executor/models/ops.py``) against
the HF modules they stand for, bit for bit: RMSNorm in Llama's and Gemma's
forms, per-head q/k norms over the fused heads, rotary embedding by lookup
(full, partial, Gemma 3's per-layer-type tables) and the gate activations."""

from __future__ import annotations

import pytest
import torch
from pagedrs.executor.models.ops import (
    RMSNorm,
    RotaryTable,
    gate_activation,
    heads_norm,
)
from transformers import AutoConfig
from transformers.activations import ACT2FN
from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm, Gemma3RotaryEmbedding
from transformers.models.llama.modeling_llama import (
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)
from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding
from transformers.models.phi3.modeling_phi3 import apply_rotary_pos_emb as phi3_rotary
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

DTYPES = [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("rows", "dim"), [(1, 576), (7, 64), (256, 640), (2048, 576)])
def test_llama_rms_norm_has_hf_bits(dtype: torch.dtype, rows: int, dim: int) -> None:
    torch.manual_seed(rows)
    norm = LlamaRMSNorm(dim, eps=1e-5).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(dim) * 0.1 + 1)
    x = (torch.randn(rows, dim) * 3).to(dtype)
    with torch.no_grad():
        assert torch.equal(RMSNorm(norm.weight, 1e-5)(x), norm(x))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("rows", "dim"), [(1, 640), (5, 256), (300, 640), (2048, 1152)])
def test_gemma_rms_norm_has_hf_bits(dtype: torch.dtype, rows: int, dim: int) -> None:
    """``(normed * (1 + w)).to(dtype)``, the factor computed once."""
    torch.manual_seed(rows)
    norm = Gemma3RMSNorm(dim, eps=1e-6).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(dim) * 0.5)
    x = (torch.randn(rows, dim) * 20).to(dtype)
    with torch.no_grad():
        assert torch.equal(RMSNorm(norm.weight, 1e-6, offset=True)(x), norm(x))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("offset", [False, True])
def test_heads_norm_over_fused_heads_has_hf_bits(dtype: torch.dtype, offset: bool) -> None:
    """One norm over the fused q/k heads (a strided view of the QKV rows)
    equals HF's ``q_norm`` on the query heads and ``k_norm`` on the key heads."""
    torch.manual_seed(int(offset))
    hq, hkv, d, t = 4, 2, 64, 9
    cls = Gemma3RMSNorm if offset else Qwen3RMSNorm
    q_norm, k_norm = cls(d, eps=1e-6).to(dtype), cls(d, eps=1e-6).to(dtype)
    with torch.no_grad():
        q_norm.weight.copy_(torch.randn(d) * 0.3 + (0 if offset else 1))
        k_norm.weight.copy_(torch.randn(d) * 0.3 + (0 if offset else 1))
    qkv = (torch.randn(t, (hq + 2 * hkv) * d) * 4).to(dtype)
    qk = qkv[:, : (hq + hkv) * d].view(t, hq + hkv, d)
    got = heads_norm(q_norm, k_norm, hq, hkv, offset)(qk)
    with torch.no_grad():
        assert torch.equal(got[:, :hq], q_norm(qk[:, :hq]))
        assert torch.equal(got[:, hq:], k_norm(qk[:, hq:]))


def _check_rotary(
    table: RotaryTable, rotary, dtype: torch.dtype, hf_apply, *args, d: int = 64
) -> None:
    hq, hkv, t = 4, 2, 11
    torch.manual_seed(t)
    positions = torch.tensor([0, 1, 2, 7, 31, 32, 33, 100, 255, 3, 64])
    qk = (torch.randn(t, hq + hkv, d) * 2).to(dtype)
    got = table.rotate(qk, *table.lookup(positions))
    with torch.no_grad():
        cos, sin = rotary(qk, positions[None], *args)
    q = qk[:, :hq].transpose(0, 1)[None]  # HF's [B, H, T, D]
    k = qk[:, hq:].transpose(0, 1)[None]
    want_q, want_k = hf_apply(q, k, cos, sin)
    assert torch.equal(got[:, :hq], want_q[0].transpose(0, 1))
    assert torch.equal(got[:, hq:], want_k[0].transpose(0, 1))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "rope",
    [
        {"rope_type": "default", "rope_theta": 10000.0},
        {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
    ],
)
def test_rotary_lookup_has_hf_bits(dtype: torch.dtype, rope: dict) -> None:
    config = AutoConfig.for_model(
        "llama", hidden_size=256, num_attention_heads=4, head_dim=64, rope_parameters=rope
    )
    rotary = LlamaRotaryEmbedding(config)
    table = RotaryTable(rotary, 256, dtype, torch.device("cpu"))
    assert table.half and table.width == 64
    _check_rotary(table, rotary, dtype, apply_rotary_pos_emb)


@pytest.mark.parametrize("dtype", DTYPES)
def test_partial_rotary_lookup_has_hf_bits(dtype: torch.dtype) -> None:
    """Phi-3's ``partial_rotary_factor``: the first channels rotated, the rest
    passed unchanged."""
    config = AutoConfig.for_model(
        "phi3", hidden_size=256, num_attention_heads=4, partial_rotary_factor=0.5
    )
    rotary = Phi3RotaryEmbedding(config)
    table = RotaryTable(rotary, 256, dtype, torch.device("cpu"))
    assert table.width == 32
    _check_rotary(table, rotary, dtype, phi3_rotary)


@pytest.mark.parametrize("layer_type", ["sliding_attention", "full_attention"])
def test_gemma3_rotary_per_layer_type_has_hf_bits(layer_type: str) -> None:
    """Gemma 3's local layers use ``rope_local_base_freq``, its global ones
    the global theta and linear scaling: one table each."""
    config = AutoConfig.for_model(
        "gemma3_text",
        hidden_size=256,
        num_attention_heads=4,
        head_dim=64,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "rope_theta": 1e6, "factor": 8.0},
        },
    )
    rotary = Gemma3RotaryEmbedding(config)
    table = RotaryTable(rotary, 256, torch.float32, torch.device("cpu"), layer_type)
    other = "full_attention" if layer_type == "sliding_attention" else "sliding_attention"
    assert not torch.equal(
        table.cos, RotaryTable(rotary, 256, torch.float32, torch.device("cpu"), other).cos
    )
    _check_rotary(table, rotary, torch.float32, apply_rotary_pos_emb, layer_type)


def test_unequal_halves_keep_the_whole_table() -> None:
    """A table whose halves differ is kept whole and rotated with HF's formula."""

    class Odd(torch.nn.Module):
        config = AutoConfig.for_model("llama", hidden_size=32, num_attention_heads=2)

        def forward(self, x, position_ids):
            angles = position_ids[..., None].float() * torch.linspace(0.1, 1.0, 16)
            return angles.cos().to(x.dtype), angles.sin().to(x.dtype)

    rotary = Odd()
    table = RotaryTable(rotary, 256, torch.float32, torch.device("cpu"))
    assert not table.half and table.width == 16
    _check_rotary(table, rotary, torch.float32, apply_rotary_pos_emb, d=16)


@pytest.mark.parametrize("name", ["silu", "swish", "gelu", "gelu_pytorch_tanh"])
def test_gate_activations_have_hf_bits(name: str) -> None:
    act = ACT2FN[name]
    fn = gate_activation(act)
    assert fn is not None
    x = torch.randn(7, 96) * 4
    assert torch.equal(fn(x), act(x))


@pytest.mark.parametrize("name", ["gelu_new", "gelu_fast", "relu", "quick_gelu"])
def test_other_activations_are_not_run_natively(name: str) -> None:
    assert gate_activation(ACT2FN[name]) is None


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("t", "rot"), [(1, 64), (37, 64), (2048, 64), (37, 32)])
def test_rotation_of_fused_qkv_rows_has_torch_bits(threads: int, t: int, rot: int) -> None:
    """Float32 q/k heads viewed in a fused QKV row (rows at the QKV stride),
    rotated in one pass on CPU: the bits of the torch formula with each
    product and sum rounded on its own (HF's ``x * cos + rotate_half(x) *
    sin``), the channels past a partial table passed unchanged."""
    hq, hkv, d = 4, 2, 64
    config = AutoConfig.for_model(
        "phi3", hidden_size=hq * d, num_attention_heads=hq, partial_rotary_factor=rot / d
    )
    table = RotaryTable(Phi3RotaryEmbedding(config), 4096, torch.float32, torch.device("cpu"))
    assert table.half and table.width == rot
    torch.manual_seed(t)
    qkv = torch.randn(t, (hq + 2 * hkv) * d) * 3
    qk = qkv[:, : (hq + hkv) * d].view(t, hq + hkv, d)
    positions = torch.randint(0, 4096, (t,))
    cos, sin = table.lookup(positions)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = table.rotate(qk, cos, sin)
    finally:
        torch.set_num_threads(before)
    h = rot // 2
    x1, x2 = qk[..., :h], qk[..., h:rot]
    want = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, qk[..., rot:]], dim=-1)
    assert got.is_contiguous() and torch.equal(got, want)
