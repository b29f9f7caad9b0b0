"""Shared fixtures: the default model, a tiny random Llama (GQA), HF references."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    # Triton kernels run under the interpreter on CPU; must precede their import.
    os.environ.setdefault("TRITON_INTERPRET", "1")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
from pagedrs.executor.model_loader import resolve_model  # noqa: E402
from pagedrs.executor.model_registry import DEFAULT_MODEL  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM  # noqa: E402

torch.set_num_threads(max(1, os.cpu_count() or 1))

# Prompts of different lengths (1 to ~60 tokens), chosen so none ends at once.
PROMPTS = [
    "Name three rivers.",
    "Hi",
    "The capital of France is",
    "Write a long story about a dragon who learns to code in Rust and Python, with many "
    "details about the journey, the friends it makes, the bugs it fixes, and the mountains "
    "it flies over on the way to the conference.",
    "1 2 3 4 5 6 7",
    "Explain what a KV cache is in a transformer.",
    "def fib(n):",
    "List the planets of the solar system in order from the sun:",
]


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """HF folder of the default model (fetched and converted once)."""
    folder, _ = resolve_model(DEFAULT_MODEL)
    return folder


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path) -> Path:
    """A random 2-layer Llama with grouped-query attention (4 query, 2 KV heads),
    saved with the default model's tokenizer."""
    folder = tmp_path_factory.mktemp("tiny-llama")
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=0.5,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(default_model_dir).save_pretrained(folder)
    return folder


def hf_greedy(
    model_dir: Path, prompts: list[str], max_new_tokens: int, **load_kwargs: object
) -> list[list[int]]:
    """HF transformers' own greedy ``generate`` per prompt (float32, no padding);
    ``load_kwargs`` go to ``from_pretrained`` (e.g. ``attn_implementation``)."""
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, **load_kwargs
    ).eval()
    outs = []
    for p in prompts:
        ids = tok(p, return_tensors="pt").input_ids
        gen = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=tok.pad_token_id or 0,
        )
        outs.append(gen[0, ids.shape[1] :].tolist())
    return outs


def hf_beams(
    model: torch.nn.Module,
    tok: object,
    prompt: str,
    k: int,
    max_new: int,
    length_penalty: float = 1.0,
    early_stopping: bool | str = False,
) -> list[list[int]]:
    """HF's own beam search (``num_beams=k``): the k returned beams' new tokens,
    each cut after its EOS."""
    ids = tok(prompt, return_tensors="pt").input_ids  # type: ignore[operator]
    out = model.generate(  # type: ignore[operator]
        ids,
        attention_mask=torch.ones_like(ids),
        num_beams=k,
        num_return_sequences=k,
        do_sample=False,
        max_new_tokens=max_new,
        length_penalty=length_penalty,
        early_stopping=early_stopping,
        pad_token_id=tok.pad_token_id,  # type: ignore[attr-defined]
    )
    eos = model.generation_config.eos_token_id
    rows = out[:, ids.shape[1] :].tolist()
    return [row[: row.index(eos) + 1] if eos in row else row for row in rows]


@pytest.fixture(scope="session")
def default_reference(default_model_dir: Path) -> list[list[int]]:
    """HF greedy outputs of the default model on PROMPTS (32 new tokens)."""
    return hf_greedy(default_model_dir, PROMPTS, 32)


@pytest.fixture(scope="session")
def tiny_reference(tiny_model_dir: Path) -> list[list[int]]:
    """HF greedy outputs of the tiny model on PROMPTS (40 new tokens)."""
    return hf_greedy(tiny_model_dir, PROMPTS, 40)
