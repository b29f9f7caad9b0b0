"""A GGUF byte-level BPE cuts text as llama.cpp does (``executor/gguf_pretok.py``):
for every ``tokenizer.ggml.pre`` name pagedrs holds, a test-written file's
tokenizer gives llama.cpp's ids (llama-cpp-python, vocabulary only) on texts
that tell the cuts apart. The vocabulary is trained on those texts with merges
that cross words, spaces, digits and punctuation, so that every cut shows in
the ids, and holds one token no merge reaches (what ``ignore_merges`` finds
whole)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gguf
import pytest
from pagedrs.executor.gguf_pretok import PRE_TOKENIZERS, PreTokenizer, set_pre_tokenizer
from pagedrs.executor.gguf_tokenizer import gguf_tokenizer
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

TEXTS = [
    "I'm sure they'll say DON'T, we'd've gone. It's Bob's.",
    "Year 12345 and 3.14159, also 1,000,000 or 42nd and 7th; 12345678.",
    "def f(x):\n    return x**2  # comment\n\n\nclass A:\n\tpass\n",
    "a   b\t\tc \n \n  d\r\ne",
    "Hello!!! ...?? (yes) [no] {maybe} <tag> $5 + 3 = 8 ^ ~ | `code` `x`",
    "naïve café Ελληνικά русский текст 中文字符 日本語のテキスト 한국어 😀👍🏽",
    "ſome Kelvin K and HelloWorld iPhone McDONALD's ÉCOLE élève",
    "नमस्ते दुनिया, e\u0301te\u0301 cafe\u0301",
    " Supercalifragilistic words  and   spaces   ",
    "x=1;y=22;z=333;w=4444 v5 v66 ab12cd 0.5e-10",
]
#: llama-cpp-python's log callback decodes each message as UTF-8, and the
#: vocabulary's printout cuts a token's bytes: its decode error is ignored.
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

#: A vocabulary entry no merge reaches.
WHOLE = "ĠSupercalifragilistic"
#: The BOS / EOS token, a control token the texts never hold.
EOS = "<|endoftext|>"


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAGEDRS_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def vocab() -> tuple[list[str], list[str]]:
    """Tokens by id and merges of a byte-level BPE trained on ``TEXTS``
    without any pre-tokenizer split, then ``WHOLE`` and ``EOS``."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    trainer = trainers.BpeTrainer(
        vocab_size=900, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(TEXTS * 3 + [t.lower() for t in TEXTS], trainer)
    model = json.loads(tok.to_str())["model"]
    tokens = sorted(model["vocab"], key=model["vocab"].__getitem__)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return [*tokens, WHOLE, EOS], merges


def _write(path: Path, pre: str | None, tokens: list[str], merges: list[str]) -> Path:
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_block_count(1)
    w.add_feed_forward_length(8)
    w.add_head_count(1)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    if pre is not None:
        w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([1] * (len(tokens) - 1) + [3])
    w.add_token_merges(merges)
    w.add_bos_token_id(len(tokens) - 1)
    w.add_eos_token_id(len(tokens) - 1)
    w.add_add_bos_token(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _llama_cpp_ids(path: Path, texts: list[str]) -> list[list[int]]:
    """llama.cpp's ids of ``texts`` (no BOS, special tokens not parsed)."""
    lc: Any = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    lc.llama_backend_init()
    params = lc.llama_model_default_params()
    params.vocab_only = True
    model = lc.llama_model_load_from_file(str(path).encode(), params)
    assert model, path
    try:
        vocab = lc.llama_model_get_vocab(model)
        out = []
        for text in texts:
            data = text.encode()
            buf = (lc.llama_token * (len(data) + 8))()
            n = lc.llama_tokenize(vocab, data, len(data), buf, len(buf), False, False)
            assert n >= 0
            out.append(list(buf[:n]))
        return out
    finally:
        lc.llama_model_free(model)


@pytest.mark.parametrize("pre", [*sorted(PRE_TOKENIZERS), None])
def test_same_ids_as_llama_cpp(
    pre: str | None, vocab: tuple[list[str], list[str]], tmp_path: Path
) -> None:
    tokens, merges = vocab
    path = _write(tmp_path / "pre.gguf", pre, tokens, merges)
    want = _llama_cpp_ids(path, [*TEXTS, "\n".join(TEXTS)])
    tok = gguf_tokenizer(path)
    got = [tok(t, add_special_tokens=False).input_ids for t in [*TEXTS, "\n".join(TEXTS)]]
    assert got == want


def _ids(pre: PreTokenizer, vocab: tuple[list[str], list[str]]) -> list[list[int]]:
    tokens, merges = vocab
    pairs = [(a, b) for a, b in (m.split(" ") for m in merges)]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=pairs))
    set_pre_tokenizer(tok, pre)
    return [tok.encode(t).ids for t in TEXTS]


def test_texts_tell_every_pre_tokenizer_apart(vocab: tuple[list[str], list[str]]) -> None:
    """Pre-tokenizers that differ give different ids on ``TEXTS``, so the
    comparison with llama.cpp checks each one's own cuts."""
    distinct = set(PRE_TOKENIZERS.values())
    ids = {pre: _ids(pre, vocab) for pre in distinct}
    clashes = [(a, b) for a in distinct for b in distinct if a != b and ids[a] == ids[b]]
    assert not clashes
    assert len(distinct) == 13


def test_whole_token_needs_ignore_merges(vocab: tuple[list[str], list[str]]) -> None:
    """``WHOLE`` comes out as one token only where merges are ignored."""
    whole = vocab[0].index(WHOLE)
    for pre in set(PRE_TOKENIZERS.values()):
        found = any(whole in ids for ids in _ids(pre, vocab))
        assert found == pre.ignore_merges, pre
