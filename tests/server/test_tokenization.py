"""The server's tokenizer: the characters-per-token bound holds for the tokenizers it
accepts and is refused for those that can drop or fuse text; tokenizing runs on
worker threads, a short text never waits behind a long one, and the event loop
keeps running meanwhile."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pagedrs.entrypoints.openai.errors import OpenAIError
from pagedrs.entrypoints.openai.tokenization import (
    SHORT_TEXT_CHARS,
    ServerTokenizer,
    dropped_chars,
    max_chars_per_token,
)
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers
from tokenizers.trainers import BpeTrainer
from transformers import AutoTokenizer

CORPUS = ["the quick brown fox jumps over the lazy dog", "héllo wörld", "    indented code"] * 20
# Texts that tokenizers pack densely: long runs of one character, combining marks.
ADVERSARIAL = [
    "#" * 5000,
    " " * 5000,
    "\n" + " " * 5000,
    "=" * 3000 + "-" * 3000,
    "e\u0301" * 2000,
    "\u1100\u1161\u11a8" * 1000,  # Hangul jamo: three compose into one syllable
    "😀" * 1000,
    "",
]
TEXTS = st.one_of(
    st.sampled_from(ADVERSARIAL),
    st.text(max_size=400),
    st.text(alphabet=" #=\n\tae\u0301\u0308", max_size=2000),
)


def _bpe(
    normalizer: Any = None,
    pre_tokenizer: Any = None,
    **bpe: Any,
) -> Tokenizer:
    tok = Tokenizer(models.BPE(**bpe))
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer or pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = BpeTrainer(
        vocab_size=400,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<s>"],
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def _wrap(tok: Tokenizer) -> SimpleNamespace:
    return SimpleNamespace(backend_tokenizer=tok)


@pytest.fixture(scope="module")
def hf_tokenizer(tiny_model_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def default_bound(hf_tokenizer: Any) -> int:
    bound = max_chars_per_token(hf_tokenizer)
    assert bound is not None
    return bound


@pytest.fixture(scope="module")
def nfc_tokenizer() -> Tokenizer:
    return _bpe(normalizers.NFC())


def test_default_tokenizer_has_a_bound(hf_tokenizer: Any, default_bound: int) -> None:
    vocab = hf_tokenizer.backend_tokenizer.get_vocab(with_added_tokens=True)
    assert default_bound == max(len(t) for t in vocab)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=TEXTS)
def test_bound_holds_for_the_default_tokenizer(
    hf_tokenizer: Any, default_bound: int, text: str
) -> None:
    dropped = dropped_chars(hf_tokenizer)
    assert dropped is not None
    kept = len(text) - sum(text.count(c) for c in dropped)
    assert kept <= default_bound * len(hf_tokenizer(text).input_ids)


def test_dropped_characters_are_listed_and_not_counted(hf_tokenizer: Any) -> None:
    # SmolLM2's byte-level vocabulary lacks byte 0x16: that character becomes no token.
    dropped = dropped_chars(hf_tokenizer)
    assert dropped is not None and "\x16" in dropped
    assert all(hf_tokenizer(c).input_ids == [] for c in dropped)
    printable = [chr(b) for b in range(32, 127)]
    assert all(hf_tokenizer(c).input_ids for c in printable)
    server = ServerTokenizer(hf_tokenizer, max_model_len=4)
    try:
        server.check_chars("\x16" * 10_000, "prompt")  # no token at all: not refused
        with pytest.raises(OpenAIError):
            server.check_chars("a" * 10_000, "prompt")
    finally:
        server.shutdown()


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=TEXTS)
def test_bound_holds_under_nfc(nfc_tokenizer: Tokenizer, text: str) -> None:
    bound = max_chars_per_token(_wrap(nfc_tokenizer))
    longest = max(len(t) for t in nfc_tokenizer.get_vocab(with_added_tokens=True))
    assert bound == 4 * longest
    assert len(text) <= bound * len(nfc_tokenizer.encode(text).ids)


def test_tokenizers_without_a_sound_bound() -> None:
    word_level = Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    word_level.pre_tokenizer = pre_tokenizers.Whitespace()
    stripping = _bpe(normalizers.Strip())
    dropping = _bpe(pre_tokenizer=pre_tokenizers.WhitespaceSplit())
    fused_unk = Tokenizer(models.BPE({"a": 0, "<unk>": 1}, [], unk_token="<unk>", fuse_unk=True))
    lstrip = _bpe()
    lstrip.add_special_tokens([AddedToken("<mask>", lstrip=True)])
    for tok in (word_level, stripping, dropping, fused_unk, lstrip):
        assert max_chars_per_token(_wrap(tok)) is None
    assert max_chars_per_token(object()) is None  # not a fast tokenizer
    # Dropped text is why: a million spaces are no tokens at all.
    assert dropping.encode(" " * 10**6).ids == []


def test_check_chars_refuses_only_what_cannot_fit(hf_tokenizer: Any, default_bound: int) -> None:
    st_ = ServerTokenizer(hf_tokenizer, max_model_len=256)
    try:
        limit = st_.max_prompt_chars
        assert limit == default_bound * 255
        st_.check_chars("a" * int(limit), "prompt")
        with pytest.raises(OpenAIError) as err:
            st_.check_chars("a" * (int(limit) + 1), "messages")
        e = err.value
        assert (e.status, e.param, e.code) == (400, "messages", "context_length_exceeded")
        assert "maximum context length is 256 tokens" in e.message
    finally:
        st_.shutdown()


def test_tokenizing_runs_off_the_loop(hf_tokenizer: Any) -> None:
    """A long text is tokenized on its own thread: the loop keeps ticking and a
    short text tokenized meanwhile is done first; results equal the tokenizer's."""
    st_ = ServerTokenizer(hf_tokenizer, max_model_len=10**9)
    long_text = "The quick brown fox jumps over the lazy dog. " * 12000  # ~0.5 MB
    assert len(long_text) > SHORT_TEXT_CHARS

    async def main() -> None:
        done: list[str] = []

        async def tokenize(name: str, text: str) -> list[int]:
            ids = await st_.encode(text)
            done.append(name)
            return ids

        long_task = asyncio.ensure_future(tokenize("long", long_text))
        await asyncio.sleep(0.05)
        short_ids = await tokenize("short", "Hello world")
        worst_gap, ticks = 0.0, 0
        while not long_task.done():
            t = time.monotonic()
            await asyncio.sleep(0.005)
            worst_gap, ticks = max(worst_gap, time.monotonic() - t), ticks + 1
        long_ids = await long_task
        assert done == ["short", "long"]
        assert short_ids == list(hf_tokenizer("Hello world").input_ids)
        assert long_ids == list(hf_tokenizer(long_text).input_ids)
        assert ticks >= 5, "the loop hardly ran while the long text was tokenized"
        # Generous: only converting the ids to a list holds the GIL.
        assert worst_gap < 2.0

    try:
        asyncio.run(main())
    finally:
        st_.shutdown()
