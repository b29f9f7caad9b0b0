"""A GGUF file's special tokens and chat template: the end-of-generation set,
BOS / EOS / EOT and add_bos_token against llama.cpp's own reading of the same
files (``llama_vocab_*`` of llama-cpp-python), and ``LLM.chat`` with the
file's ``tokenizer.chat_template``."""

from __future__ import annotations

from pathlib import Path

import jinja2
import pytest
import torch
from gguf_files import CHAT_TEMPLATE, SPECIALS, write_tiny_llama
from model_files import GEMMA3_GGUF, SMOLLM2_GGUF, gguf_file
from pagedrs import LLM, SamplingParams
from pagedrs.executor.gguf_tokens import special_tokens
from pagedrs.executor.model_loader import load_model

REAL = [SMOLLM2_GGUF, GEMMA3_GGUF]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tok") / "tiny.gguf"
    write_tiny_llama(path)
    return path


def _llama_cpp_vocab(path: Path) -> dict[str, object]:
    """llama.cpp's special tokens of ``path`` (vocabulary only, no weights)."""
    lc = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    lc.llama_backend_init()
    params = lc.llama_model_default_params()
    params.vocab_only = True
    model = lc.llama_model_load_from_file(str(path).encode(), params)
    assert model
    try:
        vocab = lc.llama_model_get_vocab(model)
        n = lc.llama_vocab_n_tokens(vocab)
        none = lambda i: None if i < 0 else int(i)  # noqa: E731 - LLAMA_TOKEN_NULL is -1
        return {
            "eog": tuple(i for i in range(n) if lc.llama_vocab_is_eog(vocab, i)),
            "bos": none(lc.llama_vocab_bos(vocab)),
            "eos": none(lc.llama_vocab_eos(vocab)),
            "eot": none(lc.llama_vocab_eot(vocab)),
            "add_bos": bool(lc.llama_vocab_get_add_bos(vocab)),
        }
    finally:
        lc.llama_model_free(model)


def _same_as_llama_cpp(path: Path) -> None:
    want = _llama_cpp_vocab(path)
    mine = special_tokens(path)
    assert mine.eog == want["eog"]
    assert (mine.bos, mine.eos, mine.eot) == (want["bos"], want["eos"], want["eot"])
    assert bool(mine.add_bos) == want["add_bos"]


def test_tiny_same_as_llama_cpp(tiny: Path) -> None:
    _same_as_llama_cpp(tiny)
    tokens = special_tokens(tiny)
    assert tokens.eog == (SPECIALS.index("<|endoftext|>"), SPECIALS.index("<|im_end|>"))
    assert tokens.chat_template == CHAT_TEMPLATE


@pytest.mark.parametrize("name", REAL)
def test_real_files_same_as_llama_cpp(name: str) -> None:
    path = gguf_file(name)
    _same_as_llama_cpp(path)


def test_generation_stops_at_every_eog(tiny: Path) -> None:
    model = load_model(str(tiny), torch.float32, torch.device("cpu"))
    assert model.generation_config.eos_token_id == list(special_tokens(tiny).eog)
    llm = LLM(str(tiny), max_model_len=64, kv_cache_memory_bytes=1 << 22)
    assert llm.llm_engine.engine_core.eos_token_ids == list(_llama_cpp_vocab(tiny)["eog"])


def test_chat_uses_the_file_template(tiny: Path) -> None:
    llm = LLM(str(tiny), max_model_len=128, kv_cache_memory_bytes=1 << 22)
    conv = [{"role": "user", "content": "The quick brown fox"}]
    out = llm.chat(conv, SamplingParams(temperature=0.0, max_tokens=3), use_tqdm=False)[0]
    text = jinja2.Template(CHAT_TEMPLATE).render(messages=conv, add_generation_prompt=True)
    assert out.prompt == text
    tok = llm.get_tokenizer()
    assert out.prompt_token_ids == tok(text, add_special_tokens=False).input_ids
    assert out.prompt_token_ids[0] == SPECIALS.index("<|im_start|>")


def test_chat_without_template_names_the_key(tmp_path: Path) -> None:
    path = tmp_path / "plain.gguf"
    write_tiny_llama(path, chat_template=None)
    llm = LLM(str(path), max_model_len=64, kv_cache_memory_bytes=1 << 22)
    with pytest.raises(
        ValueError, match=r"no chat template \(a GGUF file's 'tokenizer\.chat_template' key"
    ):
        llm.chat([{"role": "user", "content": "hi"}])
