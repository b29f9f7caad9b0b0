"""The GGUF architectures pagedrs loads quantized: each one's HF config built
from the file's metadata and the fix-ups its tensors need.

A GGUF file names its architecture in ``general.architecture`` and its
hyperparameters in ``{arch}.*`` keys (llama.cpp's ``LLM_KV_*`` names, as
``llama-model.cpp`` reads them); ``gguf_config`` turns them into the HF config
of the model type that computes the same network (``GGUF_ARCHS``), read from
the header alone (``gguf_header.read_header``: no tokenizer arrays parsed).
What the tensors need on load, per architecture:

- ``qk_permuted``: llama.cpp's converter interleaved the two rotary halves
  of each head's rows of ``attn_q`` / ``attn_k`` (llama.cpp's "normal" RoPE
  rotates adjacent pairs, HF's ``rotate_half`` the two halves); undoing it is
  a row gather (``qk_row_order``), done on quantized rows whole;
- ``norm_offset``: Gemma's RMSNorm multiplies by ``1 + w`` and the file
  stores ``1 + w``; the loader subtracts the offset from every ``*norm.weight``.

Any other architecture, and any key whose meaning pagedrs does not compute
(a RoPE scaling type other than linear, Phi-3's long-context factors, OLMo's
sliding window), raises ``GGUFLoadError`` naming the architecture or the key.
``gguf_table()`` is the docs' table of this data.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .gguf_header import GGUFHeader
from .gguf_split import GGUFModelFile

#: A single GGUF file's header, or a (possibly split) model's files: both give
#: ``path``, ``metadata`` and ``tensors``.
GGUFSource = GGUFHeader | GGUFModelFile


class GGUFLoadError(ValueError):
    """A GGUF file pagedrs cannot load quantized; the message names the
    file, the tensor and its type, or the architecture and metadata key."""


_REQUIRED = object()


class _Meta:
    """``{arch}.{key}`` lookups in a header's metadata, naming the missing key."""

    def __init__(self, header: GGUFSource, arch: str) -> None:
        self.header = header
        self.arch = arch
        self.tensor_names = {t.name for t in header.tensors}

    def __call__(self, key: str, default: Any = _REQUIRED) -> Any:
        full = f"{self.arch}.{key}"
        if full in self.header.metadata:
            return self.header.metadata[full]
        if default is _REQUIRED:
            raise GGUFLoadError(f"{self.header.path}: GGUF architecture {self.arch!r} needs {full}")
        return default

    def refuse(self, what: str) -> GGUFLoadError:
        return GGUFLoadError(f"{self.header.path}: GGUF architecture {self.arch!r}: {what}")


def _none(m: _Meta) -> dict[str, Any]:
    return {}


def _rope(m: _Meta, base: float = 10000.0) -> dict[str, Any]:
    """``rope_parameters`` of the file: its base, and linear scaling (the only
    scaling type computed; another one is refused naming the key)."""
    params: dict[str, Any] = {
        "rope_type": "default",
        "rope_theta": float(m("rope.freq_base", base)),
    }
    kind = m("rope.scaling.type", "none")
    factor = float(m("rope.scaling.factor", 1.0))
    if kind == "linear" and factor != 1.0:
        params.update(rope_type="linear", factor=factor)
    elif kind not in ("none", "linear"):
        raise m.refuse(
            f"{m.arch}.rope.scaling.type {kind!r} (pagedrs computes linear scaling only)"
        )
    return params


def _full_rotary(m: _Meta, head_dim: int) -> None:
    rot = m("rope.dimension_count", head_dim)
    if rot != head_dim:
        raise m.refuse(f"{m.arch}.rope.dimension_count {rot} != head dim {head_dim} (partial RoPE)")


def _llama(m: _Meta) -> dict[str, Any]:
    head_dim = int(m("attention.key_length", m("embedding_length") // m("attention.head_count")))
    _full_rotary(m, head_dim)
    return {"head_dim": head_dim}


def _moe(norm_topk: bool, shared: bool) -> Callable[[_Meta], dict[str, Any]]:
    def fields(m: _Meta) -> dict[str, Any]:
        out = {
            "num_experts": m("expert_count"),
            "num_experts_per_tok": m("expert_used_count"),
            "moe_intermediate_size": m("expert_feed_forward_length"),
            "norm_topk_prob": norm_topk,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
        }
        if shared:
            out["shared_expert_intermediate_size"] = m("expert_shared_feed_forward_length")
        return out

    return fields


def _phi3(m: _Meta) -> dict[str, Any]:
    if "rope_factors_long.weight" in m.tensor_names:
        raise m.refuse("rope_factors_long / rope_factors_short (long-context RoPE, longrope)")
    head_dim = m("embedding_length") // m("attention.head_count")
    rot = int(m("rope.dimension_count", head_dim))
    return {
        "partial_rotary_factor": rot / head_dim,
        "sliding_window": m("attention.sliding_window", None),
    }


def _gemma_scale(m: _Meta, layers_27b: int) -> int:
    """``query_pre_attn_scalar`` as llama.cpp sets the attention scale: the
    head dim, except hidden / heads for the 27B shape (``layers_27b`` layers)."""
    if m("block_count") == layers_27b:
        return int(m("embedding_length") // m("attention.head_count"))
    return int(m("attention.key_length"))


def _gemma2(m: _Meta) -> dict[str, Any]:
    return {
        "attn_logit_softcapping": m("attn_logit_softcapping", None),
        "final_logit_softcapping": m("final_logit_softcapping", None),
        "sliding_window": m("attention.sliding_window"),
        "query_pre_attn_scalar": _gemma_scale(m, 46),
    }


def _gemma3(m: _Meta) -> dict[str, Any]:
    return {
        "sliding_window": m("attention.sliding_window"),
        "query_pre_attn_scalar": _gemma_scale(m, 62),
        "final_logit_softcapping": m("final_logit_softcapping", None),
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": _rope(m, 1e6),
        },
    }


def _olmo2(m: _Meta) -> dict[str, Any]:
    if m("attention.sliding_window", None):
        raise m.refuse(f"{m.arch}.attention.sliding_window (OLMo 3's sliding layers)")
    return {}


def _granite(m: _Meta) -> dict[str, Any]:
    return {
        "embedding_multiplier": m("embedding_scale", 1.0),
        "residual_multiplier": m("residual_scale", 1.0),
        "attention_multiplier": m("attention.scale", 1.0),
        "logits_scaling": m("logit_scale", 1.0),
        **_llama(m),
    }


def _starcoder2(m: _Meta) -> dict[str, Any]:
    return {
        "norm_epsilon": m("attention.layer_norm_epsilon"),
        "use_bias": True,
        "sliding_window": m("attention.sliding_window", None),
    }


@dataclass(frozen=True)
class GGUFArch:
    """How one GGUF architecture loads.

    Attributes:
        model_type: the HF ``model_type`` that computes it.
        notes: what its test (``tests/models/test_gguf_archs.py``) exercises.
        fields: its config fields beyond the common ones, from the metadata.
        qk_permuted: ``attn_q`` / ``attn_k`` rows are in llama.cpp's
            interleaved rotary order.
        norm_offset: stored ``*norm.weight`` = HF weight + this.
        experts: expert stacks ``ffn_{gate,up,down}_exps`` (3-D, kept
            quantized: ``experts.QuantizedExperts``).
    """

    model_type: str
    notes: str
    fields: Callable[[_Meta], dict[str, Any]] = _none
    qk_permuted: bool = False
    norm_offset: float = 0.0
    experts: bool = False


#: GGUF ``general.architecture`` -> how it loads. Mistral's files are ``llama``.
GGUF_ARCHS: dict[str, GGUFArch] = {
    "llama": GGUFArch(
        "llama", "Llama and Mistral files; q/k rows un-interleaved, rope_freqs", _llama, True
    ),
    "qwen2": GGUFArch("qwen2", "q/k/v biases"),
    "qwen3": GGUFArch("qwen3", "q/k RMSNorm, head dim from key_length"),
    "qwen2moe": GGUFArch(
        "qwen2_moe",
        "3-D expert stacks kept quantized, a shared expert and its gate",
        _moe(norm_topk=False, shared=True),
        experts=True,
    ),
    "qwen3moe": GGUFArch(
        "qwen3_moe",
        "3-D expert stacks kept quantized, normalized top-k, q/k RMSNorm",
        _moe(norm_topk=True, shared=False),
        experts=True,
    ),
    "phi3": GGUFArch("phi3", "fused qkv and gate/up projections run fused", _phi3),
    "gemma2": GGUFArch(
        "gemma2",
        "attention and final softcaps, sliding window, (1 + w) norms",
        _gemma2,
        norm_offset=1.0,
    ),
    "gemma3": GGUFArch(
        "gemma3_text",
        "sliding window every 5 of 6 layers, q/k norms, (1 + w) norms",
        _gemma3,
        norm_offset=1.0,
    ),
    "olmo2": GGUFArch("olmo2", "q/k RMSNorm over all heads, post-norms", _olmo2),
    "granite": GGUFArch(
        "granite",
        "embedding / residual / attention / logit scales; q/k un-interleaved",
        _granite,
        True,
    ),
    "starcoder2": GGUFArch("starcoder2", "LayerNorm, biases on every projection", _starcoder2),
}


def _arch(header: GGUFSource) -> tuple[str, GGUFArch]:
    arch = str(header.metadata.get("general.architecture"))
    if arch not in GGUF_ARCHS:
        known = ", ".join(GGUF_ARCHS)
        raise GGUFLoadError(
            f"{header.path}: GGUF architecture {arch!r} is not supported by pagedrs "
            f"(supported: {known})"
        )
    return arch, GGUF_ARCHS[arch]


def gguf_arch(header: GGUFSource) -> GGUFArch:
    """The ``GGUFArch`` of the file.

    Raises:
        GGUFLoadError: an architecture outside ``GGUF_ARCHS``, named.
    """
    return _arch(header)[1]


def gguf_config(header: GGUFSource) -> Any:
    """The HF config of a GGUF file, from its metadata (module docs).

    Common fields: ``embedding_length`` (hidden size), ``block_count``,
    ``feed_forward_length``, ``attention.head_count`` / ``head_count_kv``,
    ``attention.key_length`` (head dim), ``context_length``,
    ``attention.layer_norm_rms_epsilon``, ``rope.freq_base``; the vocabulary
    is ``token_embd``'s rows, tied embeddings when the file has no
    ``output.weight``; BOS / EOS / padding ids from ``tokenizer.ggml.*``.

    Raises:
        GGUFLoadError: an unsupported architecture, a missing required key,
            or a key whose meaning pagedrs does not compute, each named.
    """
    from transformers import AutoConfig

    arch, spec = _arch(header)
    m = _Meta(header, arch)
    embd = next((t for t in header.tensors if t.name == "token_embd.weight"), None)
    if embd is None:
        raise m.refuse("no token_embd.weight tensor")
    heads_kv = m("attention.head_count_kv", m("attention.head_count"))
    if not isinstance(heads_kv, int):
        raise m.refuse(f"{arch}.attention.head_count_kv varies per layer")
    key_length = m("attention.key_length", None)
    if key_length is not None and m("attention.value_length", key_length) != key_length:
        raise m.refuse(f"{arch}.attention.value_length != key_length")
    fields: dict[str, Any] = {
        "vocab_size": int(embd.dims[1]),
        "hidden_size": m("embedding_length"),
        "num_hidden_layers": m("block_count"),
        "num_attention_heads": m("attention.head_count"),
        "num_key_value_heads": heads_kv,
        "max_position_embeddings": m("context_length"),
        "tie_word_embeddings": "output.weight" not in m.tensor_names,
        "rope_parameters": _rope(m),
    }
    if m("feed_forward_length", None) is not None:
        fields["intermediate_size"] = m("feed_forward_length")
    if key_length is not None:
        fields["head_dim"] = key_length
    eps = m("attention.layer_norm_rms_epsilon", None)
    if eps is not None:
        fields["rms_norm_eps"] = float(eps)
    for ours, key in (("bos", "bos"), ("eos", "eos"), ("pad", "padding")):
        value = header.metadata.get(f"tokenizer.ggml.{key}_token_id")
        fields[f"{ours}_token_id"] = int(value) if value is not None else None
    fields.update(spec.fields(m))
    return AutoConfig.for_model(spec.model_type, **fields)


def read_config(path: Path) -> Any:
    """``gguf_config`` of the file at ``path`` (its header read once; every
    part's tensor table for a split model, ``gguf_split``).

    Raises:
        GGUFLoadError: an unreadable file, or as ``gguf_config``.
    """
    from .gguf_header import GGUFHeaderError
    from .gguf_split import read_gguf

    try:
        header = read_gguf(path)
    except (GGUFHeaderError, OSError) as e:
        raise GGUFLoadError(
            f"{path}: not a readable GGUF file, truncated or corrupt ({type(e).__name__}: {e})"
        ) from e
    return gguf_config(header)


def qk_row_order(rows: int, heads: int) -> np.ndarray:
    """int64 ``[rows]``: the GGUF row holding each HF row of a q or k
    projection of ``heads`` heads whose rotary halves llama.cpp's converter
    interleaved (GGUF row ``2 i + j`` of a head is HF row ``i + j * d / 2``)."""
    if rows % heads or (rows // heads) % 2:
        raise GGUFLoadError(f"{rows} rows do not split into {heads} heads of even size")
    half = rows // heads // 2
    # HF row (head, j, i) sits at GGUF row (head, i, j).
    return np.arange(rows).reshape(heads, half, 2).transpose(0, 2, 1).reshape(rows)


def gguf_table() -> str:
    """The docs' table of ``GGUF_ARCHS``."""
    lines = [
        "| GGUF architecture | runs as HF model type | exercised against transformers |",
        "|---|---|---|",
    ]
    lines += [f"| `{a}` | `{s.model_type}` | {s.notes} |" for a, s in GGUF_ARCHS.items()]
    return "\n".join(lines)
