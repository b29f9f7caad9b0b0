"""A mixture-of-experts layer over quantized expert stacks in one Rust call
(``QuantizedExperts.forward``, ``pagedrs._core.QuantExperts``) against the
per-expert Python loop it stands for (``QuantizedExperts.forward_per_expert``:
one ``QuantizedLinear`` call per hit expert and projection, torch's ``silu``,
``index_add_``): the same bits, for every format mix, both activation
quantizations, any batch and thread count; a token's output the same alone
and in a batch; ``quant_silu_mul`` against torch's ``silu``.
(``tests/models/test_gguf_archs.py`` runs whole qwen2moe / qwen3moe files
against transformers.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from pagedrs import _core
from pagedrs.executor.quant.experts import QuantizedExperts
from pagedrs.executor.quant.modules import set_activation_quantization
from test_quant_linear import random_weight

#: (gate, up, down) formats: Q4_K_M's mix (down in Q6_K), 32-value blocks,
#: per-channel int8.
FORMAT_MIXES = [("Q4_K", "Q4_K", "Q6_K"), ("Q4_0", "Q8_0", "Q5_1"), ("int8", "int8", "int8")]


def experts(
    formats: tuple[str, str, str], e: int, hidden: int, inter: int, seed: int = 0
) -> QuantizedExperts:
    rng = np.random.default_rng(seed)
    g, u, d = formats
    gate = random_weight(g, e * inter, hidden, rng)
    up = random_weight(u, e * inter, hidden, rng)
    down = random_weight(d, e * hidden, inter, rng)
    return QuantizedExperts(gate, up, down, e, torch.nn.SiLU())


def routing(t: int, e: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's router on random logits: softmax, top-k, normalized."""
    gen = torch.Generator().manual_seed(seed)
    probs = torch.softmax(torch.randn(t, e, generator=gen), dim=-1)
    weights, index = torch.topk(probs, k, dim=-1)
    return index, weights / weights.sum(-1, keepdim=True)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and torch.equal(a.view(torch.int32), b.view(torch.int32))


@pytest.mark.parametrize("formats", FORMAT_MIXES)
@pytest.mark.parametrize("activations", ["int16", "int8"])
def test_one_call_equals_the_per_expert_loop(
    formats: tuple[str, str, str], activations: str
) -> None:
    layer = experts(formats, e=16, hidden=256, inter=256)
    layer.set_activations(activations)
    threads = torch.get_num_threads()
    try:
        for t in (1, 3, 16, 64):
            x = torch.randn(t, 256, generator=torch.Generator().manual_seed(t))
            index, weights = routing(t, 16, 4, seed=t)
            want = layer.forward_per_expert(x, index, weights)
            for n in sorted({1, 2, threads}):
                torch.set_num_threads(n)
                got = layer(x, index, weights)
                assert same_bits(got, want), (formats, activations, t, n)
    finally:
        torch.set_num_threads(threads)


def test_a_token_alone_and_in_a_batch_of_16() -> None:
    layer = experts(("Q4_K", "Q4_K", "Q6_K"), e=32, hidden=256, inter=256, seed=1)
    x = torch.randn(16, 256, generator=torch.Generator().manual_seed(3))
    index, weights = routing(16, 32, 8, seed=3)
    batch = layer(x, index, weights)
    for t in range(16):
        alone = layer(x[t : t + 1], index[t : t + 1], weights[t : t + 1])
        assert same_bits(alone[0], batch[t])


def test_routing_weights_widen_and_other_dtypes_take_the_loop() -> None:
    layer = experts(("Q8_0", "Q8_0", "Q8_0"), e=8, hidden=64, inter=64)
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(5))
    index, weights = routing(5, 8, 2, seed=5)
    w16 = weights.to(torch.bfloat16)
    assert same_bits(layer(x, index, w16), layer.forward_per_expert(x, index, w16))
    xb = x.to(torch.bfloat16)
    got = layer(xb, index, weights)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, layer.forward_per_expert(xb, index, weights))


def test_other_activations_take_the_loop() -> None:
    rng = np.random.default_rng(0)
    stacks = [random_weight("Q8_0", 4 * 64, 64, rng) for _ in range(3)]
    layer = QuantizedExperts(*stacks, 4, torch.nn.GELU())
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(0))
    index, weights = routing(3, 4, 2)
    assert same_bits(layer(x, index, weights), layer.forward_per_expert(x, index, weights))


def test_bad_ids_and_shapes_raise() -> None:
    layer = experts(("Q8_0", "Q8_0", "Q8_0"), e=4, hidden=64, inter=32)
    x = torch.randn(2, 64)
    with pytest.raises(ValueError, match="expert id 4 outside 0..4"):
        layer(x, torch.tensor([[0, 4], [1, 2]]), torch.ones(2, 2))
    with pytest.raises(ValueError, match="must be"):
        layer(x, torch.tensor([[0, 1]]), torch.ones(1, 2))
    stack = layer.stacks[0]
    part = (stack.qtype, stack.data.numpy(), None, stack.shape[0])
    with pytest.raises(ValueError, match="do not split into 3 experts"):
        _core.QuantExperts(part, part, part, 3)


def test_silu_mul_is_torch_silu_bit_for_bit() -> None:
    """Random float32 bit patterns (every exponent) and the edges of
    ``exp``'s range: ``quant_silu_mul`` equals ``F.silu(g) * up`` (torch's
    vectorized kernel: lengths a multiple of its 32-value step)."""
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 1 << 32, size=1 << 22, dtype=np.uint64).astype(np.uint32)
    g = bits.view(np.float32)
    edges = np.array(
        [0.0, -0.0, 88.7, -88.7, 100.0, -100.0, 103.97, -103.97, 104.0, -104.0, 104.01, -104.01]
        + [np.inf, -np.inf, 1e-38, -1e-38, 1e-45, -1e-45, 3.4e38, -3.4e38]
        + [1.0] * 12,
        dtype=np.float32,
    )
    dense = np.linspace(-110, 110, 1 << 20, dtype=np.float32)
    g = np.concatenate([g, edges, dense])
    up = np.ones_like(g)
    up[::2] = rng.standard_normal(up[::2].shape).astype(np.float32)
    out = np.empty_like(g)
    _core.quant_silu_mul(g, up, out)
    want = (F.silu(torch.from_numpy(g)) * torch.from_numpy(up)).numpy()
    nan = np.isnan(out) & np.isnan(want)
    assert np.array_equal(out.view(np.uint32)[~nan], want.view(np.uint32)[~nan])
    assert np.array_equal(np.isnan(out), np.isnan(want))
    with pytest.raises(ValueError, match="different lengths"):
        _core.quant_silu_mul(g, up[:-1], out)


def test_the_engines_activation_quantization_reaches_the_experts() -> None:
    """``set_activation_quantization`` (the engine's
    ``activation_quantization``) sets the experts' scheme, for the one call
    and the per-expert loop; the two schemes give different outputs."""
    layer = experts(("Q4_K", "Q4_K", "Q6_K"), e=8, hidden=256, inter=256)
    model = torch.nn.ModuleDict({"experts": layer})
    x = torch.randn(4, 256, generator=torch.Generator().manual_seed(4))
    index, weights = routing(4, 8, 2, seed=4)
    int16 = layer(x, index, weights)
    assert set_activation_quantization(model, "int8") == 1
    assert layer.activations == "int8"
    assert {lin.activations for lin in [*layer.gate_up, *layer.down]} == {"int8"}
    int8 = layer(x, index, weights)
    assert same_bits(int8, layer.forward_per_expert(x, index, weights))
    assert not torch.equal(int8, int16)
    with pytest.raises(ValueError, match="activation quantization 'int4'"):
        layer.set_activations("int4")
