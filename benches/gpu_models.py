"""Models for the device check, made from configs (no downloads, no weight files).

- ``SHAPES``: real model shapes (Llama-3-8B, Qwen3-8B, a small Gemma-3-like
  hybrid of sliding-window and full-attention layers). ``config_folder``
  writes a folder holding only ``config.json`` and a synthetic tokenizer;
  ``LLM(folder, load_format="dummy")`` then creates the random weights
  directly on the device in the engine's dtype.
- ``TINY_ZOO``: tiny random models of several families, saved with their
  weights (``tiny_folder``) so that HF transformers and pagedrs load the same
  ones, for greedy equality on the device.

The synthetic tokenizer is a word-level one over ``vocab_size`` names
(``<unk>``, ``<s>``, ``</s>``, ``t3``, ``t4``...): prompts are given as token ids
(``random_prompts``), so the text never matters.

    python benches/gpu_models.py [--root DIR]   # writes every folder, prints them
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

#: name -> (HF model_type, config fields): the shapes of real models.
SHAPES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama3-8b": (
        "llama",
        {
            "vocab_size": 128256,
            "hidden_size": 4096,
            "intermediate_size": 14336,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "max_position_embeddings": 8192,
            "rope_theta": 500000.0,
            "rms_norm_eps": 1e-5,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "tie_word_embeddings": False,
        },
    ),
    "qwen3-8b": (
        "qwen3",
        {
            "vocab_size": 151936,
            "hidden_size": 4096,
            "intermediate_size": 12288,
            "num_hidden_layers": 36,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "max_position_embeddings": 40960,
            "rope_theta": 1000000.0,
            "rms_norm_eps": 1e-6,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "tie_word_embeddings": False,
        },
    ),
    # Gemma-3-1B-like: 5 sliding-window layers per full-attention one.
    "gemma3-1b-like": (
        "gemma3_text",
        {
            "vocab_size": 32768,
            "hidden_size": 1152,
            "intermediate_size": 6912,
            "num_hidden_layers": 26,
            "num_attention_heads": 4,
            "num_key_value_heads": 1,
            "head_dim": 256,
            "sliding_window": 512,
            "query_pre_attn_scalar": 256,
            "max_position_embeddings": 32768,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "pad_token_id": 0,
        },
    ),
}

_TINY: dict[str, Any] = {
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
}
WINDOW = 40

#: name -> (HF model_type, config fields): tiny models of several families.
TINY_ZOO: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("llama", _TINY),
    "qwen3": ("qwen3", {**_TINY, "head_dim": 16}),
    "mistral": ("mistral", {**_TINY, "sliding_window": WINDOW}),
    "qwen3_moe": (
        "qwen3_moe",
        {
            **_TINY,
            "head_dim": 16,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "decoder_sparse_step": 1,
        },
    ),
    "gemma2": (
        "gemma2",
        {**_TINY, "head_dim": 16, "sliding_window": WINDOW, "query_pre_attn_scalar": 16},
    ),
    "gemma3_text": (
        "gemma3_text",
        {
            **_TINY,
            "head_dim": 16,
            "sliding_window": WINDOW,
            "query_pre_attn_scalar": 16,
            "final_logit_softcapping": 30.0,
        },
    ),
    "gpt_oss": (
        "gpt_oss",
        {
            **_TINY,
            "head_dim": 16,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "sliding_window": WINDOW,
            "layer_types": ["sliding_attention", "full_attention"],
        },
    ),
    "phi3": ("phi3", {**_TINY, "sliding_window": WINDOW, "pad_token_id": 0}),
}


def synthetic_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """A word-level tokenizer over ``vocab_size`` names: ``<unk>`` (0), ``<s>``
    (1), ``</s>`` (2), then ``t3``, ``t4``... split on whitespace."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    names = ["<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(3, vocab_size)]
    tok = Tokenizer(models.WordLevel({n: i for i, n in enumerate(names)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )


def make_config(model_type: str, fields: dict[str, Any], **overrides: Any) -> Any:
    """The HF config of ``model_type`` with ``fields`` and ``overrides``."""
    return AutoConfig.for_model(model_type, **{**fields, **overrides})


def config_folder(name: str, root: Path, **overrides: Any) -> Path:
    """``root/name``: the config of ``SHAPES[name]`` (with ``overrides``) and a
    synthetic tokenizer, no weights: load it with ``load_format="dummy"``."""
    model_type, fields = SHAPES[name]
    folder = root / name
    config = make_config(model_type, fields, **overrides)
    config.save_pretrained(folder)
    synthetic_tokenizer(config.vocab_size).save_pretrained(folder)
    return folder


def tiny_folder(name: str, root: Path, seed: int = 0) -> Path:
    """``root/name``: the tiny model ``TINY_ZOO[name]`` with random float32
    weights (std 0.2: peaked logits, so greedy ties are rare) and a synthetic
    tokenizer, saved as an HF folder."""
    model_type, fields = TINY_ZOO[name]
    folder = root / name
    config = make_config(model_type, fields)
    config.initializer_range = 0.2
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(folder)
    synthetic_tokenizer(config.vocab_size).save_pretrained(folder)
    return folder


def random_prompts(num: int, length: int, vocab_size: int, seed: int = 0) -> list[list[int]]:
    """``num`` prompts of ``length`` token ids drawn from ``[3, vocab_size)``
    (no special tokens)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab_size, (num, length), generator=gen).tolist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=None, help="folder (default: a temp one)")
    args = parser.parse_args()
    root = args.root or Path(tempfile.mkdtemp(prefix="pagedrs-gpu-models-"))
    for name in SHAPES:
        print(f"{name}: {config_folder(name, root)} (config only: load_format='dummy')")
    for name in TINY_ZOO:
        print(f"{name}: {tiny_folder(name, root / 'tiny')}")


if __name__ == "__main__":
    main()
