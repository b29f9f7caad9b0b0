"""Shared fixtures: the default model, a tiny random Llama (GQA), HF references."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    # Triton kernels run under the interpreter on CPU; must precede their import.
    os.environ.setdefault("TRITON_INTERPRET", "1")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
from model_files import GEMMA3_GGUF, SMOLLM2_GGUF, gguf_file  # noqa: E402
from pagedrs.executor.model_loader import dequantized_copy  # noqa: E402
from pagedrs.executor.model_registry import DEFAULT_MODEL  # noqa: E402
from reference import PROMPTS, hf_greedy  # noqa: E402
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM  # noqa: E402

torch.set_num_threads(max(1, os.cpu_count() or 1))


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """HF folder of the default model (fetched and converted once)."""
    folder = dequantized_copy(DEFAULT_MODEL)
    return folder


@pytest.fixture(scope="session")
def smol_gguf() -> Path:
    """The default model's GGUF file (SmolLM2-135M-Instruct, Q4_1)."""
    return gguf_file(SMOLLM2_GGUF)


@pytest.fixture(scope="session")
def gemma_gguf() -> Path:
    """Gemma 3 270M's GGUF file (Q4_K_M)."""
    return gguf_file(GEMMA3_GGUF)


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


@pytest.fixture(scope="session")
def default_reference(default_model_dir: Path) -> list[list[int]]:
    """HF greedy outputs of the default model on PROMPTS (32 new tokens)."""
    return hf_greedy(default_model_dir, PROMPTS, 32)


@pytest.fixture(scope="session")
def tiny_reference(tiny_model_dir: Path) -> list[list[int]]:
    """HF greedy outputs of the tiny model on PROMPTS (40 new tokens)."""
    return hf_greedy(tiny_model_dir, PROMPTS, 40)
