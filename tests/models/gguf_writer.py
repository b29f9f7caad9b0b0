"""Write an HF model as a GGUF file the way llama.cpp's converter lays it out,
its projections quantized, and set the HF model's weights to the file's
dequantized values: the reference for a GGUF architecture test.

Per architecture, as ``convert_hf_to_gguf.py`` and ``llama-model.cpp`` do:
the ``{arch}.*`` hyperparameter keys; tensor names from gguf-py's table;
Llama's and Granite's ``attn_q`` / ``attn_k`` rows interleaved per head (the
converter's ``permute``); Llama 3's RoPE scaling as ``rope_freqs`` divisors;
Gemma's norms stored as ``1 + w``; an MoE layer's experts (HF's
``gate_up_proj [E, 2I, H]`` / ``down_proj [E, H, I]``) as
``ffn_gate_exps`` / ``ffn_up_exps`` ``[E, I, H]`` and ``ffn_down_exps``.

Quantization: gguf-py quantizes Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 (from the
HF weights); it cannot quantize the K types (``gguf.quants.quantize`` raises
``NotImplementedError`` for Q4_K / Q6_K), so those tensors are random valid
blocks: random quants and sub-block scales, the f16 super-block scales set so
the values have the wanted standard deviation. Either way the HF model then
holds exactly the file's dequantized values (gguf-py's dequantization).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from transformers import PreTrainedModel

#: GGUF types written by quantizing the weights; the K types are random blocks.
QUANTIZABLE = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")
STD = 0.1

_PERMUTED = ("llama", "granite")
_NORM_OFFSET = {"gemma2": 1.0, "gemma3": 1.0}


def _metadata(w: gguf.GGUFWriter, arch: str, config: object) -> None:
    c = config
    a = arch

    def u32(key: str, v: int) -> None:
        w.add_uint32(f"{a}.{key}", int(v))

    def f32(key: str, v: float) -> None:
        w.add_float32(f"{a}.{key}", float(v))

    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    u32("context_length", c.max_position_embeddings)
    u32("embedding_length", c.hidden_size)
    u32("block_count", c.num_hidden_layers)
    u32("feed_forward_length", c.intermediate_size)
    u32("attention.head_count", c.num_attention_heads)
    u32("attention.head_count_kv", c.num_key_value_heads)
    f32(
        "rope.freq_base",
        c.rope_parameters.get("rope_theta", 10000.0)
        if "rope_theta" in c.rope_parameters
        else c.rope_parameters["full_attention"]["rope_theta"],
    )
    if arch == "starcoder2":
        f32("attention.layer_norm_epsilon", c.norm_epsilon)
    else:
        f32("attention.layer_norm_rms_epsilon", c.rms_norm_eps)
    if arch in ("llama", "granite"):
        u32("rope.dimension_count", head_dim)
    if head_dim != c.hidden_size // c.num_attention_heads or arch.startswith(("gemma", "qwen3")):
        u32("attention.key_length", head_dim)
        u32("attention.value_length", head_dim)
    if arch.startswith("gemma"):
        u32("attention.sliding_window", c.sliding_window)
    if arch == "gemma2":
        f32("attn_logit_softcapping", c.attn_logit_softcapping)
        f32("final_logit_softcapping", c.final_logit_softcapping)
    if arch in ("qwen2moe", "qwen3moe"):
        u32("expert_count", c.num_experts)
        u32("expert_used_count", c.num_experts_per_tok)
        u32("expert_feed_forward_length", c.moe_intermediate_size)
    if arch == "qwen2moe":
        u32("expert_shared_feed_forward_length", c.shared_expert_intermediate_size)
    if arch == "granite":
        f32("embedding_scale", c.embedding_multiplier)
        f32("residual_scale", c.residual_multiplier)
        f32("attention.scale", c.attention_multiplier)
        f32("logit_scale", c.logits_scaling)
    w.add_bos_token_id(c.bos_token_id)
    w.add_eos_token_id(c.eos_token_id)


def _permute(rows: np.ndarray, heads: int) -> np.ndarray:
    """The converter's interleaving of each head's rotary halves."""
    n = rows.shape[0]
    return (
        rows.reshape(heads, 2, n // heads // 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)
    )


def _unpermute(rows: np.ndarray, heads: int) -> np.ndarray:
    n = rows.shape[0]
    return (
        rows.reshape(heads, n // heads // 2, 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)
    )


def _random_k_blocks(rows: int, cols: int, qtype: str, rng: np.random.Generator) -> np.ndarray:
    """uint8 ``[rows, bytes per row]``: random valid Q4_K / Q6_K blocks whose
    values have standard deviation ``STD``."""
    t = gguf.GGMLQuantizationType[qtype]
    block, size = gguf.GGML_QUANT_SIZES[t]
    n_blocks = rows * cols // block
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)

    def set_scales(d: float) -> None:
        if qtype == "Q4_K":  # d, dmin (f16) lead the block; dmin ~ 7.5 d centres the values
            raw[:, 0:2] = np.frombuffer(np.float16(d).tobytes(), np.uint8)
            raw[:, 2:4] = np.frombuffer(np.float16(7.5 * d).tobytes(), np.uint8)
        elif qtype == "Q6_K":  # d (f16) ends the block
            raw[:, size - 2 : size] = np.frombuffer(np.float16(d).tobytes(), np.uint8)
        else:
            raise ValueError(f"no random-block writer for {qtype}")

    set_scales(1e-3)
    std = float(gguf.quants.dequantize(raw.reshape(rows, -1), t).std())
    set_scales(1e-3 * STD / std)
    return raw.reshape(rows, -1)


def _encode(
    values: np.ndarray, qtype: str, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """(GGUF bytes, dequantized float32 values) of a float ``[..., K]`` tensor."""
    t = gguf.GGMLQuantizationType[qtype]
    flat = values.reshape(-1, values.shape[-1]).astype(np.float32)
    if qtype in QUANTIZABLE:
        data = gguf.quants.quantize(flat, t)
    else:
        data = _random_k_blocks(flat.shape[0], flat.shape[1], qtype, rng)
    deq = gguf.quants.dequantize(data, t).reshape(values.shape).astype(np.float32)
    return data.reshape(*values.shape[:-1], -1), deq


def _rope_freqs(model: PreTrainedModel) -> np.ndarray | None:
    """llama.cpp's ``rope_freqs`` of a model whose rotary table is not RoPE's
    default (Llama 3's scaling): each frequency's divisor, default / actual."""
    rotary = model.get_decoder().rotary_emb
    params = model.config.rope_parameters
    if params.get("rope_type", "default") == "default":
        return None
    dim = rotary.inv_freq.numel() * 2
    base = params["rope_theta"]
    default = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    return (default / rotary.inv_freq.float()).numpy()


def _copy_tokenizer(w: gguf.GGUFWriter, source: Path) -> None:
    """The vocabulary, merges and chat template of GGUF file ``source``
    (its BOS / EOS ids are the model config's, written with the metadata)."""
    reader = gguf.GGUFReader(source)

    def field(key: str) -> Any:
        return reader.fields[key].contents()

    w.add_tokenizer_model(field("tokenizer.ggml.model"))
    w.add_tokenizer_pre(field("tokenizer.ggml.pre"))
    w.add_token_list(list(field("tokenizer.ggml.tokens")))
    w.add_token_types(list(field("tokenizer.ggml.token_type")))
    w.add_token_merges(list(field("tokenizer.ggml.merges")))
    w.add_add_bos_token(field("tokenizer.ggml.add_bos_token"))
    w.add_add_space_prefix(field("tokenizer.ggml.add_space_prefix"))
    w.add_chat_template(field("tokenizer.chat_template"))


def write_gguf(
    path: Path,
    arch: str,
    model: PreTrainedModel,
    qtype: str,
    second: str,
    seed: int = 0,
    tokenizer_from: Path | None = None,
) -> None:
    """Write ``model`` to ``path`` as GGUF architecture ``arch`` and set its
    weights to the file's dequantized values.

    Projections and the token embeddings are in ``qtype``, except ``attn_v``,
    ``ffn_down`` (and its expert stack) and ``token_embd`` in ``second`` (as
    llama.cpp's ``*_M`` mixes keep some tensors in a wider type); norms,
    biases and the MoE router in F32. ``tokenizer_from``: a GGUF file whose
    tokenizer fields are copied (llama.cpp needs a vocabulary to load a file).
    """
    rng = np.random.default_rng(seed)
    config = model.config
    archs = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}
    table = gguf.get_tensor_name_map(archs[arch], config.num_hidden_layers)
    writer = gguf.GGUFWriter(str(path), arch)
    _metadata(writer, arch, config)
    if tokenizer_from is not None:
        _copy_tokenizer(writer, tokenizer_from)
    tensors: list[tuple[str, np.ndarray, gguf.GGMLQuantizationType | None]] = []
    with torch.no_grad():
        for hf_name, param in model.named_parameters():
            base, _, suffix = hf_name.rpartition(".")
            values = param.detach().float().numpy()
            if base.endswith("mlp.experts"):
                layer = int(hf_name.split(".")[2])
                if suffix == "gate_up_proj":
                    gate, up = np.split(values, 2, axis=1)
                    out = []
                    for kind, v in (("gate", gate), ("up", up)):
                        data, deq = _encode(v, qtype, rng)
                        tensors.append((f"blk.{layer}.ffn_{kind}_exps.weight", data, qtype))
                        out.append(deq)
                    param.copy_(torch.from_numpy(np.concatenate(out, axis=1)))
                else:
                    data, deq = _encode(values, second, rng)
                    tensors.append((f"blk.{layer}.ffn_down_exps.weight", data, second))
                    param.copy_(torch.from_numpy(deq))
                continue
            gguf_base = table.get_name(base) or table.get_name(base.removeprefix("model."))
            assert gguf_base is not None, hf_name
            name = f"{gguf_base}.{suffix}"
            kind = gguf_base.split(".")[-1]
            heads = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}
            permute = arch in _PERMUTED and kind in heads and suffix == "weight"
            if values.ndim == 1 or kind in ("ffn_gate_inp",):
                if kind.endswith("norm") and arch in _NORM_OFFSET:
                    tensors.append((name, values + _NORM_OFFSET[arch], None))
                else:
                    tensors.append((name, values, None))
                continue
            wide = kind in ("attn_v", "ffn_down", "ffn_down_shexp", "token_embd")
            q = second if wide else qtype
            layout = _permute(values, heads[kind]) if permute else values
            data, deq = _encode(layout, q, rng)
            tensors.append((name, data, q))
            param.copy_(torch.from_numpy(_unpermute(deq, heads[kind]) if permute else deq))
    rope_freqs = _rope_freqs(model)
    if rope_freqs is not None:
        tensors.append(("rope_freqs.weight", rope_freqs, None))
    for name, data, q in tensors:
        if q is None:
            writer.add_tensor(name, np.ascontiguousarray(data, dtype=np.float32))
        else:
            writer.add_tensor(name, data, raw_dtype=gguf.GGMLQuantizationType[q])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
