"""Model shapes for the step-time model: the sizes that set a step's FLOPs and
bytes (layers, widths, heads, vocabulary), from a transformers config or a
named preset.

Presets carry the published configurations of the models the validation uses
(OPT-13B of the paper, Llama-3-8B / 70B, SmolLM2-135M, this engine's default
model); any other model is read from its ``config.json`` (a folder or the file).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = ["MODEL_PRESETS", "ModelShape", "resolve_model_shape"]


@dataclass(frozen=True)
class ModelShape:
    """What a decoder-only transformer computes per token.

    Attributes:
        name: label.
        num_layers: decoder layers.
        hidden_size: model width.
        num_heads: query heads.
        num_kv_heads: key/value heads (grouped-query attention).
        head_dim: width of one head.
        intermediate_size: MLP width.
        vocab_size: LM head rows.
        gated_mlp: three MLP projections (SwiGLU: gate, up, down) rather than two.
        tie_word_embeddings: the LM head is the embedding (counted once in bytes).
        max_position_embeddings: longest context.
    """

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    gated_mlp: bool = True
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 2048

    def __post_init__(self) -> None:
        for f in (
            "num_layers",
            "hidden_size",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "intermediate_size",
            "vocab_size",
            "max_position_embeddings",
        ):
            v = getattr(self, f)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"model {self.name!r}: {f} must be a positive integer, got {v!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"model {self.name!r}: num_heads ({self.num_heads}) is not a multiple of "
                f"num_kv_heads ({self.num_kv_heads})"
            )

    @property
    def layer_params(self) -> int:
        """Weights of one decoder layer's projections (attention and MLP; norms
        and biases left out)."""
        q = self.hidden_size * self.num_heads * self.head_dim
        kv = 2 * self.hidden_size * self.num_kv_heads * self.head_dim
        o = self.num_heads * self.head_dim * self.hidden_size
        mlp = (3 if self.gated_mlp else 2) * self.hidden_size * self.intermediate_size
        return q + kv + o + mlp

    @property
    def linear_params(self) -> int:
        """Projection weights every token multiplies (all layers)."""
        return self.num_layers * self.layer_params

    @property
    def lm_head_params(self) -> int:
        """LM head weights (``vocab_size * hidden_size``), applied to sampled rows only."""
        return self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        """All weights: layers, embedding, LM head (once when tied)."""
        emb = self.vocab_size * self.hidden_size
        return self.linear_params + emb + (0 if self.tie_word_embeddings else emb)

    def kv_elements_per_token(self) -> int:
        """K and V values one token stores over all layers."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim

    def as_dict(self) -> dict[str, Any]:
        """Every field by name."""
        return asdict(self)

    @classmethod
    def from_hf_config(cls, config: dict[str, Any], name: str = "model") -> ModelShape:
        """From a transformers ``config.json`` dict (Llama, Mistral, Qwen, OPT,
        GPT-2 style names).

        Raises:
            ValueError: a field the shape needs is missing, naming it.
        """

        def get(*keys: str, default: Any = None) -> Any:
            for k in keys:
                if config.get(k) is not None:
                    return config[k]
            if default is not None:
                return default
            raise ValueError(f"model {name!r}: config.json has none of {list(keys)}")

        hidden = int(get("hidden_size", "n_embd", "d_model"))
        heads = int(get("num_attention_heads", "n_head"))
        model_type = config.get("model_type", "")
        gated = model_type not in ("opt", "gpt2", "gpt_neox", "gptj", "bloom", "falcon")
        return cls(
            name=name,
            num_layers=int(get("num_hidden_layers", "n_layer")),
            hidden_size=hidden,
            num_heads=heads,
            num_kv_heads=int(get("num_key_value_heads", default=heads)),
            head_dim=int(get("head_dim", default=hidden // heads)),
            intermediate_size=int(
                get("intermediate_size", "ffn_dim", "n_inner", default=4 * hidden)
            ),
            vocab_size=int(get("vocab_size")),
            gated_mlp=gated,
            tie_word_embeddings=bool(config.get("tie_word_embeddings", model_type == "opt")),
            max_position_embeddings=int(
                get("max_position_embeddings", "n_positions", default=2048)
            ),
        )


#: Published configurations (config.json of each model).
MODEL_PRESETS: dict[str, ModelShape] = {
    "opt-13b": ModelShape("opt-13b", 40, 5120, 40, 40, 128, 20480, 50272, False, True, 2048),
    "llama-3-8b": ModelShape("llama-3-8b", 32, 4096, 32, 8, 128, 14336, 128256, True, False, 8192),
    "llama-3-70b": ModelShape(
        "llama-3-70b", 80, 8192, 64, 8, 128, 28672, 128256, True, False, 8192
    ),
    "smollm2-135m": ModelShape("smollm2-135m", 30, 576, 9, 3, 64, 1536, 49152, True, True, 8192),
}


def resolve_model_shape(model: str) -> ModelShape:
    """A preset name, a folder holding ``config.json``, the file itself, or a
    packaged pagedrs model alias (its float copy's folder, ``hf_folder``).

    Raises:
        ValueError: none of these, naming the presets.
    """
    key = model.lower()
    if key in MODEL_PRESETS:
        return MODEL_PRESETS[key]
    path = Path(model).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        try:
            config = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"model config {path}: line {e.lineno}: {e.msg}") from e
        return ModelShape.from_hf_config(config, name=path.parent.name)
    from ..executor.model_registry import PACKAGED_MODELS

    if model in PACKAGED_MODELS:
        from ..executor.model_loader import hf_folder

        return resolve_model_shape(str(hf_folder(model)))
    raise ValueError(
        f"unknown model {model!r}: a preset ({', '.join(sorted(MODEL_PRESETS))}), "
        "a folder with config.json, or a packaged model alias"
    )
