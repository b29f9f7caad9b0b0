"""A GGUF model's projections repacked at load into the panel layout (Q4_0,
Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q6_K weights, groups of 16 interleaved outputs) give the
logits of the file's row layout bit for bit, on int8 activations, at every
batch shape; the tied embedding reads the same repacked weight; int16
activations put the weights back in rows."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gguf_files import write_tiny_llama
from pagedrs.executor.quant.gguf_loader import load_gguf_quantized
from pagedrs.executor.quant.modules import (
    QuantizedEmbedding,
    QuantizedLinearModule,
    set_activation_quantization,
)
from transformers import AutoConfig


def _load(path: Path) -> torch.nn.Module:
    config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    model = load_gguf_quantized(path, config, torch.float32)
    # HF's own attention: the forward runs outside an engine step.
    model.config._attn_implementation = "eager"
    return model


def _layouts(model: torch.nn.Module) -> set[str]:
    return {m.qweight.layout for m in model.modules() if isinstance(m, QuantizedLinearModule)}


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"])
def test_panel_layout_gives_the_row_layouts_logits(tmp_path: Path, qtype: str) -> None:
    # 403 tokens: the tied LM head's last panel group holds 3 outputs.
    path = tmp_path / f"tiny-{qtype}.gguf"
    write_tiny_llama(path, qtype, vocab_size=403)
    rows, panels = _load(path), _load(path)
    set_activation_quantization(rows, "int8", panels=False)
    set_activation_quantization(panels, "int8", panels=True)
    assert _layouts(rows) == {"rows"} and _layouts(panels) == {"panels"}
    head = panels.get_output_embeddings()
    embed = panels.get_input_embeddings()
    assert isinstance(embed, QuantizedEmbedding) and head.qweight is embed.qweight
    assert head.qweight.data.shape[0] == 416  # 403 rounded up to 16
    gen = torch.Generator().manual_seed(0)
    for batch, length in [(1, 1), (1, 9), (3, 5), (17, 2)]:
        ids = torch.randint(0, 403, (batch, length), generator=gen)
        with torch.no_grad():
            want = rows(input_ids=ids).logits
            got = panels(input_ids=ids).logits
        assert torch.equal(got.view(torch.int32), want.view(torch.int32)), (qtype, batch, length)
    # int16 activations put the weights back in the file's rows.
    set_activation_quantization(panels, "int16")
    assert _layouts(panels) == {"rows"}
    assert panels.get_output_embeddings().qweight is panels.get_input_embeddings().qweight
    set_activation_quantization(rows, "int16")
    ids = torch.randint(0, 403, (2, 4), generator=gen)
    with torch.no_grad():
        assert torch.equal(panels(input_ids=ids).logits, rows(input_ids=ids).logits)


def _qtypes(model: torch.nn.Module, layout: str) -> set[str]:
    return {
        m.qweight.qtype
        for m in model.modules()
        if isinstance(m, QuantizedLinearModule) and m.qweight.layout == layout
    }


def test_k_quant_panels_give_gemma3_q4_k_ms_row_logits(gemma_gguf: Path) -> None:
    # The real Gemma 3 270M Q4_K_M: attn_output and ffn_down in Q4_K and
    # Q6_K (K = 1024, 2048: 4 and 8 blocks of 256), 640 outputs (40 whole
    # panel groups); the tied LM head in Q8_0.
    rows, panels = _load(gemma_gguf), _load(gemma_gguf)
    set_activation_quantization(rows, "int8", panels=False)
    set_activation_quantization(panels, "int8", panels=True)
    assert _layouts(rows) == {"rows"}
    assert {"Q4_K", "Q6_K", "Q8_0"} <= _qtypes(panels, "panels")
    head = panels.get_output_embeddings()
    assert head.qweight.layout == "panels" and head.qweight is panels.get_input_embeddings().qweight
    gen = torch.Generator().manual_seed(1)
    vocab = panels.config.vocab_size
    for batch, length in [(1, 1), (1, 9), (3, 5), (17, 2)]:
        ids = torch.randint(0, vocab, (batch, length), generator=gen)
        with torch.no_grad():
            want = rows(input_ids=ids).logits
            got = panels(input_ids=ids).logits
        assert torch.equal(got.view(torch.int32), want.view(torch.int32)), (batch, length)
