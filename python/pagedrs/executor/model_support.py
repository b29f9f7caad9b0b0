"""Which HF architectures pagedrs runs, and the clear refusal of every other one.

A model runs only when pagedrs computes exactly what transformers computes for
it: its attention must go through a registered attention function (which
pagedrs replaces with paged attention), its positions must come from rotary
embeddings or learned tables (never biases added to the attention scores), and
every layer must be attention plus a feed-forward block. Everything else is
refused at load, before any weights are read, with one ``ValueError`` naming
the model type and the missing feature.

``SUPPORTED_MODEL_TYPES`` and ``REFUSED_FEATURES`` are the data the loader uses;
README's "Supported models" tables are produced from them
(``python -m pagedrs.executor.model_support`` prints them; a test checks README).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

import torch

#: HF ``model_type`` -> what the zoo test (``tests/models/test_model_zoo.py``)
#: exercises for it against transformers' own ``generate``.
SUPPORTED_MODEL_TYPES: dict[str, str] = {
    "llama": "grouped-query attention, llama3 rope scaling; pagedrs' own fused code",
    "mistral": "sliding window; pagedrs' own fused code",
    "qwen2": "q/k/v biases, sliding window (use_sliding_window); pagedrs' own fused code",
    "qwen3": "q/k RMSNorm; pagedrs' own fused code",
    "qwen3_moe": "mixture of experts, q/k RMSNorm",
    "mixtral": "mixture of experts",
    "qwen2_moe": "mixture of experts with a shared expert, sliding window",
    "gemma": "scaled embeddings, (1 + w) RMSNorm; pagedrs' own fused code",
    "gemma2": (
        "sliding window, attention and final logit softcapping, query_pre_attn_scalar; "
        "pagedrs' own fused code"
    ),
    "gemma3_text": (
        "sliding window, final logit softcapping, query_pre_attn_scalar, q/k norm, rope per "
        "layer type; pagedrs' own fused code"
    ),
    "phi3": "fused qkv and gate/up projections, sliding window; pagedrs' own fused code",
    "gpt2": "learned positions, Conv1D projections",
    "opt": "learned positions (offset 2), pre-scaled queries",
    "gpt_neox": "partial rotary, parallel residual",
    "starcoder2": "sliding window, biases",
    "olmo2": "q/k RMSNorm after the projections, post-norms",
    "granite": "embedding / residual / attention multipliers, logits_scaling",
    "cohere": "parallel block, LayerNorm, logit_scale",
    "stablelm": "partial rotary, LayerNorm",
    "gpt_oss": "attention sinks, alternating sliding window, mixture of experts",
}

#: Tensor-parallel sharding (``distributed/sharding.py``) handles these only.
TENSOR_PARALLEL_MODEL_TYPES: tuple[str, ...] = ("llama", "mistral", "qwen2")

#: Refused feature -> (what pagedrs lacks, model types known to have it).
REFUSED_FEATURES: dict[str, tuple[str, tuple[str, ...]]] = {
    "ALiBi": (
        "ALiBi position biases added to the attention scores",
        ("bloom", "mpt", "falcon (alibi=true)"),
    ),
    "cross-attention": (
        "cross-attention / encoder-decoder layers",
        ("t5", "bart", "whisper", "gpt2 (add_cross_attention=true)"),
    ),
    "recurrent": (
        "recurrent or state-space layers",
        ("mamba", "mamba2", "jamba", "recurrent_gemma", "rwkv", "zamba", "bamba", "qwen3_next"),
    ),
    "remote code": (
        "custom modeling code (auto_map / trust_remote_code)",
        ("any config.json with auto_map",),
    ),
    "multimodal": (
        "multimodal inputs (vision / audio encoders)",
        ("llava", "gemma3", "qwen2_vl", "mllama", "idefics3"),
    ),
    "own attention": (
        "attention computed inside the layer, not through a registered attention function",
        ("falcon",),
    ),
    "dynamic rope": (
        "rope scaling that depends on the current sequence length (dynamic, longrope)",
        ("phi3 (longrope)", "llama (rope_type=dynamic)"),
    ),
    "quantized": (
        "quantized checkpoints (quantization_config) other than GGUF",
        ("gptq", "awq", "bitsandbytes"),
    ),
    "unsupported architecture": (
        "an architecture outside the supported list",
        ("any other model_type",),
    ),
}

#: model types refused whatever their settings, by feature.
_REFUSED_MODEL_TYPES: dict[str, str] = {
    "bloom": "ALiBi",
    "mpt": "ALiBi",
    "falcon": "own attention",
    **{
        t: "recurrent"
        for t in (
            "mamba",
            "mamba2",
            "falcon_mamba",
            "falcon_h1",
            "jamba",
            "recurrent_gemma",
            "rwkv",
            "zamba",
            "zamba2",
            "bamba",
            "nemotron_h",
            "granitemoehybrid",
            "lfm2",
            "qwen3_next",
            "xlstm",
            "minimax",
        )
    },
}

#: layer types (``config.layer_types``) that are attention layers.
_ATTENTION_LAYER_TYPES = frozenset({"full_attention", "sliding_attention"})

#: rope types whose tables depend on the current sequence length ("su": the
#: name of longrope in Phi-3's first configs).
DYNAMIC_ROPE_TYPES = frozenset({"dynamic", "longrope", "su"})


def refusal(model_type: str, feature: str) -> ValueError:
    """The one error pagedrs raises for ``model_type`` lacking ``feature``."""
    what, _ = REFUSED_FEATURES[feature]
    if feature == "unsupported architecture":
        known = ", ".join(sorted(SUPPORTED_MODEL_TYPES))
        return ValueError(
            f"model type {model_type!r} is not supported by pagedrs (supported: {known})"
        )
    return ValueError(f"model type {model_type!r} is not supported by pagedrs: {what}")


def _get(config: Any, name: str, default: Any = None) -> Any:
    if isinstance(config, Mapping):
        return config.get(name, default)
    return getattr(config, name, default)


def rope_types(config: Any) -> set[str]:
    """The config's rope types (``rope_parameters`` or ``rope_scaling``; per
    layer type where it has one set per type, as Gemma 3); empty when
    unset."""
    out: set[str] = set()
    for name in ("rope_parameters", "rope_scaling"):
        params = _get(config, name)
        if not isinstance(params, Mapping):
            continue
        nested = [p for p in params.values() if isinstance(p, Mapping)]
        for p in nested or [params]:
            rope = p.get("rope_type") or p.get("type")
            if rope:
                out.add(str(rope))
    return out


def refused_feature(config: Any) -> str | None:
    """The ``REFUSED_FEATURES`` key that rules this config out, or None.

    Args:
        config: an HF ``PretrainedConfig`` or the raw ``config.json`` dict.
    """
    model_type = str(_get(config, "model_type", ""))
    if _get(config, "auto_map"):
        return "remote code"
    if _get(config, "is_encoder_decoder") or _get(config, "add_cross_attention"):
        return "cross-attention"
    if _get(config, "alibi") or _get(config, "position_embedding_type") == "alibi":
        return "ALiBi"
    if any(_get(config, k) is not None for k in ("vision_config", "audio_config")):
        return "multimodal"
    if model_type in _REFUSED_MODEL_TYPES:
        return _REFUSED_MODEL_TYPES[model_type]
    layer_types = _get(config, "layer_types") or ()
    if any(t not in _ATTENTION_LAYER_TYPES for t in layer_types):
        return "recurrent"
    if rope_types(config) & DYNAMIC_ROPE_TYPES:
        return "dynamic rope"
    quant = _get(config, "quantization_config")
    if quant and _get(quant, "quant_method") != "gguf":
        return "quantized"
    if model_type not in SUPPORTED_MODEL_TYPES:
        return "unsupported architecture"
    return None


def _uses_attention_interface(config: Any) -> bool:
    """Whether the causal-LM class of this config's model type calls attention
    through transformers' registry of attention functions."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.model_type)
    if name is None:
        return False
    import transformers

    cls = getattr(transformers, name, None)
    if cls is None:
        return False
    module = importlib.import_module(cls.__module__)
    return "ALL_ATTENTION_FUNCTIONS" in vars(module)


def check_config(config: Any, raw: Mapping[str, Any] | None = None) -> None:
    """Accept ``config`` or raise the one clear error naming what is missing.

    Args:
        config: an HF ``PretrainedConfig`` (or None when only ``raw`` was read).
        raw: the ``config.json`` contents, checked first (remote-code configs
            cannot be parsed by transformers without running their code).
    Raises:
        ValueError: ``model type '<type>' is not supported by pagedrs: <feature>``,
            or a mixture of experts routing each token to more experts than it
            has (``num_experts_per_tok`` > ``num_experts``).
    """
    for source in (raw, config):
        if source is None:
            continue
        feature = refused_feature(source)
        if feature is not None:
            raise refusal(str(_get(source, "model_type", "?")), feature)
    if config is not None and not _uses_attention_interface(config):
        raise refusal(config.model_type, "own attention")
    source = config if config is not None else raw
    experts = _get(source, "num_experts") if source is not None else None
    top_k = _get(source, "num_experts_per_tok") if source is not None else None
    if isinstance(experts, int) and isinstance(top_k, int) and experts > 0 and top_k > experts:
        raise ValueError(
            f"config: num_experts_per_tok={top_k} is more than num_experts={experts} "
            "(each token takes its num_experts_per_tok best experts)"
        )


def check_tensor_parallel(config: Any, world: int) -> None:
    """Raise unless ``distributed/sharding.py`` shards this architecture correctly.

    Raises:
        ValueError: a model type outside ``TENSOR_PARALLEL_MODEL_TYPES``.
    """
    model_type = str(_get(config, "model_type", "?"))
    if model_type not in TENSOR_PARALLEL_MODEL_TYPES:
        known = ", ".join(TENSOR_PARALLEL_MODEL_TYPES)
        raise ValueError(
            f"model type {model_type!r} cannot run with tensor_parallel_size={world}: "
            f"pagedrs shards only {known}"
        )


def logits_transform(config: Any) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """What the model's own forward applies to the LM head's output, or None.

    granite-style ``logits_scaling`` divides, cohere-style ``logit_scale``
    multiplies, gemma2/gemma3-style ``final_logit_softcapping`` is
    ``cap * tanh(logits / cap)``; applied in that order, in float32.
    """
    divide = _get(config, "logits_scaling")
    multiply = _get(config, "logit_scale")
    cap = _get(config, "final_logit_softcapping")
    steps: list[Callable[[torch.Tensor], torch.Tensor]] = []
    if divide is not None and float(divide) != 1.0:
        steps.append(lambda x: x / float(divide))
    if multiply is not None and float(multiply) != 1.0:
        steps.append(lambda x: x * float(multiply))
    if cap:
        steps.append(lambda x: torch.tanh(x / float(cap)) * float(cap))
    if not steps:
        return None

    def apply(logits: torch.Tensor) -> torch.Tensor:
        for step in steps:
            logits = step(logits)
        return logits

    return apply


def readme_tables() -> str:
    """README's "Supported models" tables, produced from the data above."""
    lines = ["| model type | exercised against transformers |", "|---|---|"]
    lines += [f"| `{t}` | {notes} |" for t, notes in SUPPORTED_MODEL_TYPES.items()]
    lines += ["", "| refused feature | error names | known model types |", "|---|---|---|"]
    for feature, (what, types) in REFUSED_FEATURES.items():
        lines.append(f"| {feature} | {what} | {', '.join(types)} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(readme_tables())
