"""The prompts the engine's outputs are checked on, and HF transformers' own
greedy and beam-search outputs to check them against (float32, no padding).

Imported by name (``from reference import PROMPTS``): ``tests/`` is on the
path once its conftest is loaded, and a module of its own keeps the name from
being shadowed by another folder's ``conftest``."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

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
