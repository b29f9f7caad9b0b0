"""GGUF files loaded with their tensors kept quantized, and int8 quantization
of float weights: outputs against HF transformers on the same (dequantized)
weights, no float copy of the projections, and the refusals."""

from __future__ import annotations

import copy
import gc
from pathlib import Path

import pytest
import torch
from pagedrs import EngineArgs
from pagedrs.executor.quant.gguf_loader import GGUFLoadError, load_gguf_quantized
from pagedrs.executor.quant.int8 import quantize_int8
from pagedrs.executor.quant.modules import QuantizedEmbedding, QuantizedLinearModule
from torch import nn
from transformers import AutoConfig


def _config(path: Path):
    return AutoConfig.from_pretrained(path.parent, gguf_file=path.name)


def test_gguf_stays_quantized(smol_gguf: Path) -> None:
    model = load_gguf_quantized(smol_gguf, _config(smol_gguf), torch.float32)
    # Only 1-D float parameters (norms); every projection and the embeddings
    # are quantized, the tied LM head shares the embedding's weight.
    big = [n for n, p in model.named_parameters() if p.dim() > 1]
    assert big == []
    assert isinstance(model.get_input_embeddings(), QuantizedEmbedding)
    head = model.get_output_embeddings()
    assert isinstance(head, QuantizedLinearModule)
    assert head.qweight is model.get_input_embeddings().qweight
    layer = model.model.layers[0]
    assert isinstance(layer.self_attn.q_proj, QuantizedLinearModule)
    assert layer.self_attn.q_proj.qweight.qtype == "Q4_1"


def test_gguf_greedy_matches_hf(smol_gguf: Path) -> None:
    from pagedrs import LLM, SamplingParams
    from transformers import AutoModelForCausalLM, AutoTokenizer

    llm = LLM(
        model=str(smol_gguf),
        max_model_len=128,
        kv_cache_memory_bytes=1 << 26,
        activation_quantization="int16",  # the exact option
    )
    prompts = ["The capital of France is", "Write a haiku about the sea:"]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=8))
    tok = AutoTokenizer.from_pretrained(smol_gguf.parent, gguf_file=smol_gguf.name)
    hf = AutoModelForCausalLM.from_pretrained(
        smol_gguf.parent, gguf_file=smol_gguf.name, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    for prompt, out in zip(prompts, outs, strict=True):
        ids = tok(prompt, return_tensors="pt").input_ids
        ref = hf.generate(ids, max_new_tokens=8, do_sample=False)[0, ids.shape[1] :]
        assert out.outputs[0].token_ids == ref.tolist()


def test_truncated_gguf_names_file_tensor_type(tmp_path: Path, smol_gguf: Path) -> None:
    cut = tmp_path / "cut.gguf"
    size = smol_gguf.stat().st_size
    with open(smol_gguf, "rb") as src, open(cut, "wb") as dst:
        dst.write(src.read(size // 2))
    # The header is whole: the first tensor past the end is named with its type.
    with pytest.raises(
        GGUFLoadError,
        match=r"cut\.gguf: tensor '[a-z0-9_.]+' \((Q4_1|Q8_0|F32), shape \[[\d, ]+\]\) needs "
        r"\d+ bytes at offset \d+, but the file ends after \d+ of them",
    ):
        load_gguf_quantized(cut, _config(smol_gguf), torch.float32)
    cut.write_bytes(smol_gguf.read_bytes()[:4096])  # the header itself cut short
    with pytest.raises(
        GGUFLoadError, match=r"cut\.gguf: truncated or corrupt GGUF: metadata key .* past the end"
    ):
        load_gguf_quantized(cut, _config(smol_gguf), torch.float32)


def test_shape_mismatch_names_tensor(tmp_path: Path, smol_gguf: Path) -> None:
    config = copy.deepcopy(_config(smol_gguf))
    config.intermediate_size = 1024
    gc.collect()
    before = _live_quantized_weights()
    with pytest.raises(GGUFLoadError, match=r"SmolLM2.*ffn_.*Q4_1.*does not match the config"):
        load_gguf_quantized(smol_gguf, config, torch.float32)
    # The tensors loaded before the refusal (embeddings, layer 0's attention) are all freed.
    gc.collect()
    assert _live_quantized_weights() == before


def _live_quantized_weights() -> int:
    from pagedrs.executor.quant.weight import QuantizedWeight

    return sum(type(o) is QuantizedWeight for o in gc.get_objects())


def test_unsupported_type_refused_by_name(tmp_path: Path) -> None:
    import gguf
    import numpy as np
    from pagedrs.executor.quant.gguf_header import read_header
    from pagedrs.executor.quant.gguf_loader import check_tensors

    path = tmp_path / "iq.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.IQ4_NL]
    raw = np.zeros((4, 64 // block * size), dtype=np.uint8)
    writer.add_tensor("blk.0.attn_q.weight", raw, raw_dtype=gguf.GGMLQuantizationType.IQ4_NL)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    header = read_header(path)
    with pytest.raises(GGUFLoadError, match=r"iq\.gguf.*'blk\.0\.attn_q\.weight'.*IQ4_NL"):
        check_tensors(path, header)
    with pytest.raises(GGUFLoadError, match=r"iq\.gguf.*'blk\.0\.attn_q\.weight'.*IQ4_NL"):
        load_gguf_quantized(path, None, torch.float32)


def test_corrupt_gguf_names_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\xff" * 64)
    with pytest.raises(GGUFLoadError, match=r"bad\.gguf"):
        load_gguf_quantized(bad, None, torch.float32)


def test_quantization_field_checked() -> None:
    with pytest.raises(ValueError, match="quantization"):
        EngineArgs(quantization="fp4")


def test_quantize_int8_error_bound() -> None:
    torch.manual_seed(0)
    w = torch.randn(33, 70)
    w[3] = 0.0
    q = quantize_int8(w)
    assert q.data.dtype == torch.int8 and q.scales is not None
    err = (q.dequantize() - w).abs()
    assert bool((err <= q.scales[:, None] / 2 + 1e-7).all())
    assert bool((q.dequantize()[3] == 0).all())


def test_int8_model_matches_reference_math() -> None:
    """A tiny Llama quantized to int8: every decoder projection is int8 and
    the model's logits equal HF's on the dequantized weights."""
    from pagedrs.executor.quant.int8 import quantize_model_int8
    from transformers import AutoModelForCausalLM

    config = AutoConfig.for_model(
        "llama",
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=100,
    )
    torch.manual_seed(0)
    ref = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    model = copy.deepcopy(ref)
    assert quantize_model_int8(model) == 14
    for mod_ref, mod_q in zip(ref.modules(), model.modules(), strict=True):
        if isinstance(mod_q, QuantizedLinearModule):
            assert isinstance(mod_ref, nn.Linear)
            mod_ref.weight.data = mod_q.qweight.dequantize()
    ids = torch.tensor([[1, 5, 7, 9]])
    with torch.no_grad():
        # The kernels quantize activations per 32 values to int16 (relative error ~2^-15
        # per block, executor/quant/linear.py), hence a tolerance beyond float rounding.
        torch.testing.assert_close(model(ids).logits, ref(ids).logits, atol=2e-3, rtol=2e-3)


def test_gemma3_q4_k_m_greedy_matches_hf(gemma_gguf: Path) -> None:
    """The real Gemma 3 270M Q4_K_M (Q4_K, Q5_0, Q6_K, Q8_0 tensors) through
    pagedrs' own Gemma code on its quantized projections: greedy tokens equal
    HF's on the dequantized file (float32, eager)."""
    from pagedrs import LLM, SamplingParams
    from pagedrs.executor.models import PagedGemmaModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    llm = LLM(
        model=str(gemma_gguf),
        max_model_len=128,
        kv_cache_memory_bytes=1 << 26,
        activation_quantization="int16",  # the exact option
    )
    # pagedrs' own Gemma code on the quantized projections.
    assert isinstance(llm.llm_engine.engine_core.runner.native, PagedGemmaModel)
    prompt = "The capital of France is"
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=6))[0]
    tok = AutoTokenizer.from_pretrained(gemma_gguf.parent, gguf_file=gemma_gguf.name)
    hf = AutoModelForCausalLM.from_pretrained(
        gemma_gguf.parent,
        gguf_file=gemma_gguf.name,
        dtype=torch.float32,
        attn_implementation="eager",
    ).eval()
    ids = tok(prompt, return_tensors="pt").input_ids
    ref = hf.generate(ids, max_new_tokens=6, do_sample=False)[0, ids.shape[1] :]
    assert out.outputs[0].token_ids == ref.tolist()
