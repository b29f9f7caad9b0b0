"""A PEFT adapter written as a llama.cpp GGUF LoRA file, laid out as
llama.cpp's ``convert_lora_to_gguf.py`` lays it out: ``general.type =
adapter``, ``adapter.type = lora``, ``adapter.lora.alpha``, and per adapted
base tensor ``blk.N.<name>.weight.lora_a`` ([r, in]) / ``.lora_b`` ([out,
r]), llama's ``attn_q`` / ``attn_k`` ``lora_b`` rows in the converter's
interleaved rotary order."""

from __future__ import annotations

import json
import re
from pathlib import Path

import gguf
import numpy as np
import torch
from safetensors.torch import load_file

#: HF projection -> llama.cpp's tensor name (llama-arch.cpp's LLM_TENSOR_*).
GGUF_NAMES = {
    "q_proj": "attn_q",
    "k_proj": "attn_k",
    "v_proj": "attn_v",
    "o_proj": "attn_output",
    "gate_proj": "ffn_gate",
    "up_proj": "ffn_up",
    "down_proj": "ffn_down",
}
#: HF model type -> GGUF architecture, and whether its converter interleaves q/k rows.
ARCHS = {"llama": ("llama", True), "qwen2": ("qwen2", False), "gemma3_text": ("gemma3", False)}

_KEY = re.compile(r"layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")


def interleave_rows(b: torch.Tensor, heads: int) -> torch.Tensor:
    """The converter's q/k row permutation (llama.cpp's ``LlamaModel.permute``)
    applied to ``lora_b``'s rows: each head's two rotary halves interleaved."""
    out, r = b.shape
    return b.reshape(heads, 2, out // heads // 2, r).swapaxes(1, 2).reshape(out, r)


def _add(writer: gguf.GGUFWriter, name: str, t: torch.Tensor, qtype: str) -> None:
    """One tensor in ``qtype`` (F32, F16, BF16 or Q8_0; Q8_0 falls back to
    F16 for rows that are not whole blocks, as the converter does)."""
    x = t.float().numpy()
    kind = gguf.GGMLQuantizationType[qtype]
    if kind == gguf.GGMLQuantizationType.F32:
        writer.add_tensor(name, x)
        return
    try:
        data = gguf.quants.quantize(x, kind)
    except gguf.QuantError:
        kind, data = gguf.GGMLQuantizationType.F16, x.astype(np.float16)
    writer.add_tensor(name, data, raw_dtype=kind)


def write_gguf_lora(
    peft_dir: Path, out: Path, model_type: str, heads: int, kv_heads: int, qtype: str = "F32"
) -> Path:
    """``peft_dir``'s adapter as a GGUF LoRA file at ``out``."""
    cfg = json.loads((peft_dir / "adapter_config.json").read_text())
    tensors = load_file(str(peft_dir / "adapter_model.safetensors"))
    arch, interleaved = ARCHS[model_type]
    writer = gguf.GGUFWriter(str(out), arch)
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(cfg["lora_alpha"]))
    pairs: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, t in tensors.items():
        m = _KEY.search(key)
        assert m is not None, key
        pairs.setdefault((int(m.group(1)), m.group(2)), {})[m.group(3)] = t
    for (layer, module), ab in sorted(pairs.items()):
        b = ab["B"]
        if interleaved and module in ("q_proj", "k_proj"):
            b = interleave_rows(b, heads if module == "q_proj" else kv_heads)
        name = f"blk.{layer}.{GGUF_NAMES[module]}.weight"
        _add(writer, f"{name}.lora_a", ab["A"], qtype)
        _add(writer, f"{name}.lora_b", b, qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
