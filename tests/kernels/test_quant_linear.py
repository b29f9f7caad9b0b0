"""The quantized-weight kernels (pagedrs._core.QuantWeights via
``QuantizedLinear``) against gguf's own dequantization, in every kernel
variant this CPU runs (the portable one always).

The kernels quantize each activation row per block of 32 values to int16
(``d = amax / 32767``, ``q = round(x / d)``), so two tolerances:
- against the exact product of the dequantized weights and the quantized
  activations ``d * q``: float32 summation only, at most
  ``(K / 32 + 8) * 2^-23 * sum |w x|`` (one rounding per block's fused
  multiply-add and per lane of the final sum);
- against the float reference ``x @ W^T`` (``QuantizedLinear.reference``):
  that plus the activation rounding, at most ``sum_b amax_b / 65534 *
  sum_{i in b} |w_i|`` per output (each value moves by at most ``d / 2``).
"""

import gguf
import numpy as np
import pytest
import torch
from pagedrs.executor.quant.linear import QuantizedLinear, quant_isas
from pagedrs.executor.quant.weight import GGUF_BLOCK_TYPES, QuantizedWeight, quantize_int8

ISAS = quant_isas()
FORMATS = [*GGUF_BLOCK_TYPES, "int8"]
# Byte offsets of each block's float16 fields (scales, minimums).
F16_FIELDS = {"Q4_1": (0, 2), "Q5_1": (0, 2), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def random_weight(qtype: str, n: int, k: int, rng: np.random.Generator) -> QuantizedWeight:
    """A ``[n, k]`` weight of ``qtype``: int8 and the 32-value formats
    quantized from normal floats (``gguf.quants.quantize``, Q4_1 / Q5_1 and
    Q8_0 included); k-quants as random blocks (random quants, small random
    float16 scales and minimums), which gguf cannot quantize to."""
    if qtype == "int8":
        return quantize_int8(torch.from_numpy(rng.standard_normal((n, k)).astype(np.float32)))
    qt = gguf.GGMLQuantizationType[qtype]
    block, size = GGUF_BLOCK_TYPES[qtype]
    if block == 32:
        data = gguf.quants.quantize(rng.standard_normal((n, k)).astype(np.float32), qt)
    else:
        data = rng.integers(0, 256, size=(n, k // block, size), dtype=np.uint8)
        for at in F16_FIELDS[qtype]:
            f16 = rng.uniform(-0.02, 0.02, size=(n, k // block)).astype(np.float16)
            data[:, :, at : at + 2] = f16.view(np.uint8).reshape(n, k // block, 2)
    return QuantizedWeight(
        qtype, (n, k), torch.from_numpy(np.ascontiguousarray(data).reshape(n, -1))
    )


#: The largest quantized activation of each ``activations`` choice.
Q_MAX = {"int16": 32767.0, "int8": 127.0}


def quantized_acts(x: torch.Tensor, activations: str = "int16") -> torch.Tensor:
    """``d * q`` of the kernels' activations (int16, or int8 as llama.cpp's
    Q8_0 blocks), float64 ``[T, K]``."""
    q_max = Q_MAX[activations]
    blocks = x.float().reshape(x.shape[0], -1, 32)
    amax = blocks.abs().amax(-1, keepdim=True).double()
    # float32 quotients correctly rounded (as the kernels' `q_max / amax`):
    # torch's float32 division of a scalar by a tensor may multiply by the
    # reciprocal instead, which moves a value sitting on a tie.
    inv = torch.where(amax > 0, q_max / amax, torch.zeros_like(amax)).float()
    q = torch.round(blocks * inv).clamp(-q_max, q_max)
    return (q.double() * (amax / q_max).float().double()).reshape(x.shape)


def bounds(
    x: torch.Tensor, w: torch.Tensor, activations: str = "int16"
) -> tuple[torch.Tensor, torch.Tensor]:
    """(float32 summation bound, activation rounding bound), ``[T, N]``."""
    xq = quantized_acts(x, activations)
    k = x.shape[1]
    summation = (xq.abs() @ w.abs().double().T) * (k / 32 + 8) * 2.0**-23 + 1e-30
    amax = x.float().reshape(x.shape[0], -1, 32).abs().amax(-1).double()  # [T, K/32]
    wsum = w.abs().double().reshape(w.shape[0], -1, 32).sum(-1)  # [N, K/32]
    return summation, (amax * (0.5 + 1e-6) / Q_MAX[activations]) @ wsum.T


def _x(t: int, k: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    x = torch.randn(t, k, generator=gen)
    x[:, ::37] *= 8.0  # a few outliers
    return x.to(dtype)


@pytest.mark.parametrize("activations", ["int16", "int8"])
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", FORMATS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_matches_dequantized_reference(isa, qtype, dtype, activations):
    rng = np.random.default_rng(FORMATS.index(qtype))
    gen = torch.Generator().manual_seed(FORMATS.index(qtype))
    # Several blocks, not a multiple of the kernels' tiles: 5 k-quant
    # blocks, 3 blocks of 32; N of 1 and N not a multiple of the tile.
    k = 1280 if qtype.endswith("_K") else 96
    for n, t in [(1, 1), (37, 5), (3, 7)]:
        w = random_weight(qtype, n, k, rng)
        wf = w.dequantize()
        x = _x(t, k, dtype, gen)
        lin = QuantizedLinear([w], isa=isa, activations=activations)
        y = lin(x)
        assert y.dtype == dtype and y.shape == (t, n)
        summation, rounding = bounds(x, wf, activations)
        exact = quantized_acts(x, activations) @ wf.double().T
        out_rounding = exact.abs() * 2.0**-8 if dtype == torch.bfloat16 else 0.0
        err = (y.double() - exact).abs()
        assert (err <= summation + out_rounding).all(), (qtype, isa, n, t, err.max())
        ref = x.double() @ wf.double().T
        err_ref = (y.double() - ref).abs()
        assert (err_ref <= summation + rounding + out_rounding).all(), (qtype, isa, n, t)


@pytest.mark.parametrize("activations", ["int16", "int8"])
@pytest.mark.parametrize("qtype", FORMATS)
def test_every_variant_gives_the_same_bits(qtype, activations):
    rng = np.random.default_rng(11)
    k = 512 if qtype.endswith("_K") else 160
    w = random_weight(qtype, 45, k, rng)
    x = _x(40, k, torch.float32, torch.Generator().manual_seed(1))
    outs = [QuantizedLinear([w], isa=isa, activations=activations)(x) for isa in ISAS]
    for isa, y in zip(ISAS, outs, strict=True):
        assert torch.equal(y, outs[-1]), f"{isa} differs from portable"


@pytest.mark.skipif("amx_int8" not in ISAS, reason="this CPU has no AMX (amx_int8)")
@pytest.mark.parametrize("qtype", FORMATS)
def test_amx_tiles_give_the_portable_bits(qtype):
    """The AMX tiles (int8 activations, 8+ rows: whole and partial 16-row
    tiles, odd output groups) equal the portable kernel bit for bit."""
    rng = np.random.default_rng(13)
    k = 512 if qtype.endswith("_K") else 320
    w = random_weight(qtype, 77, k, rng)
    x = _x(83, k, torch.float32, torch.Generator().manual_seed(3))
    amx = QuantizedLinear([w], isa="amx_int8", activations="int8")
    portable = QuantizedLinear([w], isa="portable", activations="int8")
    for rows in [8, 16, 33, 83]:
        assert torch.equal(amx(x[:rows]), portable(x[:rows])), (qtype, rows)


@pytest.mark.parametrize("activations", ["int16", "int8"])
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", ["Q4_0", "Q5_1", "Q4_K", "Q6_K", "int8"])
def test_batch_invariance(isa, qtype, activations):
    """A row's output bits alone equal its bits inside 2, 5, 64 and 256 rows,
    wherever it sits."""
    rng = np.random.default_rng(5)
    k = 512
    w = random_weight(qtype, 70, k, rng)
    lin = QuantizedLinear([w], isa=isa, activations=activations)
    x = _x(256, k, torch.float32, torch.Generator().manual_seed(2))
    for rows in [2, 5, 64, 256]:
        y = lin(x[:rows])
        for r in {0, 1, rows // 2, rows - 1}:
            assert torch.equal(lin(x[r : r + 1])[0], y[r]), (rows, r)


def test_fused_parts_of_different_formats_and_bias():
    """A fused projection (parts in Q4_K, Q6_K, Q8_0) equals its parts side
    by side, bias added, with the same bits."""
    rng = np.random.default_rng(9)
    k = 512
    parts = [random_weight("Q4_K", 64, k, rng), random_weight("Q6_K", 32, k, rng)]
    parts.append(random_weight("Q8_0", 32, k, rng))
    bias = torch.randn(128)
    x = _x(6, k, torch.float32, torch.Generator().manual_seed(3))
    y = QuantizedLinear(parts, bias)(x)
    alone = torch.cat([QuantizedLinear([p])(x) for p in parts], dim=1) + bias
    assert torch.equal(y, alone)
    assert QuantizedLinear(parts, bias).add_to(torch.ones(6, 128), x).sub(1).allclose(y, atol=1e-5)


@pytest.mark.parametrize("qtype", list(GGUF_BLOCK_TYPES))
def test_dequantize_gives_gguf_py_values(qtype):
    """``QuantizedWeight.dequantize`` (``_core.dequantize``) equals gguf-py's
    ``quants.dequantize`` (ggml's formulas) bit for bit, signs of zero aside."""
    rng = np.random.default_rng(7)
    w = random_weight(qtype, 37, 512, rng)
    want = gguf.quants.dequantize(w.data.numpy(), gguf.GGMLQuantizationType[qtype])
    got = w.dequantize()
    assert got.dtype == torch.float32 and tuple(got.shape) == (37, 512)
    assert np.array_equal(got.numpy(), np.asarray(want, dtype=np.float32).reshape(37, 512))
    rows = w.rows(5, 3).dequantize()
    assert torch.equal(rows, got[5:8])


def test_int8_weight_follows_its_scales():
    w = torch.randn(40, 96)
    w[3] = 0.0
    q = quantize_int8(w)
    assert q.data.dtype == torch.int8 and q.scales is not None and q.scales[3] == 0
    assert (q.dequantize() - w).abs().le(q.scales[:, None] / 2 + 1e-7).all()
    with pytest.raises(ValueError, match="NaN"):
        quantize_int8(torch.full((2, 32), float("nan")))


def test_refusals_name_the_problem():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="portable|variant"):
        QuantizedLinear([random_weight("Q4_0", 4, 64, rng)], isa="sse9")
    with pytest.raises(ValueError, match="int8.*48"):
        QuantizedLinear([quantize_int8(torch.randn(4, 48))])
    lin = QuantizedLinear([random_weight("Q4_0", 4, 64, rng)])
    with pytest.raises(ValueError, match="64 input features"):
        lin(torch.randn(2, 32))
    with pytest.raises(ValueError, match="activation quantization 'int4'"):
        QuantizedLinear([random_weight("Q4_0", 4, 64, rng)], activations="int4")


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"])
def test_panel_layout_round_trips_and_gives_the_rows_bits(qtype: str) -> None:
    # 77 outputs: a partial last group of 16; K of 10 sub-blocks (a whole
    # and a partial step of 8), k-quants 2 blocks of 256.
    rng = np.random.default_rng(41)
    k = 512 if qtype.endswith("_K") else 320
    rows = random_weight(qtype, 77, k, rng)
    panels = rows.to_panels()
    assert panels.layout == "panels" and tuple(panels.data.shape) == (80, rows.data.shape[1])
    assert panels.to_panels() is panels and rows.to_rows() is rows
    assert torch.equal(panels.to_rows().data, rows.data)
    ids = torch.tensor([76, 0, 33, 33])
    assert torch.equal(panels.row_bytes(ids), rows.data[ids])
    assert torch.equal(panels.rows(10, 20).data, rows.data[10:30])
    assert torch.equal(panels.dequantize(), rows.dequantize())
    for isa in quant_isas():
        a = QuantizedLinear([rows], activations="int8", isa="portable")
        b = QuantizedLinear([panels, rows], activations="int8", isa=isa)
        for t in [*range(1, 18), 23, 64]:
            x = torch.from_numpy(rng.standard_normal((t, k)).astype(np.float32))
            want = a(x)
            got = b(x)
            assert torch.equal(got[:, :77].view(torch.int32), want.view(torch.int32)), (isa, t)
            assert torch.equal(got[:, 77:].view(torch.int32), want.view(torch.int32)), (isa, t)
        # int16 activations on panels: the portable kernel, the rows' bits.
        b.activations = a.activations = "int16"
        x = torch.from_numpy(rng.standard_normal((3, k)).astype(np.float32))
        assert torch.equal(b(x)[:, :77], a(x))


def test_panel_layout_refusals_name_the_problem() -> None:
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="int8 weights have no panel layout"):
        quantize_int8(torch.randn(16, 256)).to_panels()
    w = random_weight("Q4_0", 17, 64, rng)
    with pytest.raises(ValueError, match=r"panels of a \[17, 64\] weight must be uint8 \[32, 36\]"):
        QuantizedWeight("Q4_0", (17, 64), w.data, layout="panels")
    with pytest.raises(ValueError, match="layout 'cols'"):
        QuantizedWeight("Q4_0", (17, 64), w.data, layout="cols")
    with pytest.raises(IndexError, match="outside a weight of 17 rows"):
        w.to_panels().row_bytes(torch.tensor([17]))


def test_activation_switch_repacks_only_formats_with_panels() -> None:
    from pagedrs.executor.quant.modules import (
        QuantizedLinearModule,
        panels_run_here,
        set_activation_quantization,
    )

    rng = np.random.default_rng(1)
    model = torch.nn.Sequential(
        QuantizedLinearModule(random_weight("Q4_0", 32, 256, rng)),
        QuantizedLinearModule(quantize_int8(torch.randn(256, 32 * 8))),
    )
    assert set_activation_quantization(model, "int8", panels=True) == 2
    assert [m.qweight.layout for m in model] == ["panels", "rows"]
    assert [m.linear.activations for m in model] == ["int8", "int8"]
    set_activation_quantization(model, "int16")
    assert [m.qweight.layout for m in model] == ["rows", "rows"]
    assert panels_run_here("int16") is False
    assert panels_run_here("int8") == ("avx512_vnni" in quant_isas())
