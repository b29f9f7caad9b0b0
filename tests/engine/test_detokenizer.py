"""IncrementalDetokenizer: streamed text equals tokenizer.decode, stop strings, holdback."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pagedrs.detokenizer import IncrementalDetokenizer
from pagedrs.executor.model_loader import dequantized_copy
from transformers import AutoTokenizer

ENGLISH = (
    "The quick brown fox jumps over the lazy dog. It's 3:45 p.m., isn't it?\n"
    "  def f(x):\n        return x ** 2  # squares\n"
)
MULTIBYTE = "Héllo wörld, ça va? 你好，世界！ 😀🎉👍🏽 naïve café — “quoted” ½ 日本語のテキスト"


@pytest.fixture(scope="module")
def tok():
    folder = dequantized_copy("smollm2-135m-instruct")
    return AutoTokenizer.from_pretrained(folder)


@pytest.fixture(scope="module")
def partial_char_ids(tok) -> list[int]:
    """Ids whose own decode holds U+FFFD: a byte-level token that splits a character."""
    outs = tok.backend_tokenizer.decode_batch([[i] for i in range(len(tok))])
    ids = [i for i, s in enumerate(outs) if "\ufffd" in s]
    assert len(ids) > 50
    return ids


def run(
    det: IncrementalDetokenizer, chunks: Sequence[Sequence[int]]
) -> tuple[str | None, list[str], list[str]]:
    """Feed ``chunks`` (stopping at a stop string), taking a delta after each.

    Returns (stop string or None, deltas including the final one, the streamed text
    after each non-final delta).
    """
    deltas: list[str] = []
    streamed: list[str] = []
    stop = None
    for chunk in chunks:
        stop = det.append(chunk)
        if stop is not None:
            break
        deltas.append(det.next_delta())
        streamed.append("".join(deltas))
    deltas.append(det.next_delta(finished=True))
    assert "".join(deltas) == det.output_text
    return stop, deltas, streamed


def check_deltas_never_broken(deltas: list[str], final: str) -> None:
    """A U+FFFD in a streamed delta must be a U+FFFD of the final text at that place."""
    pos = 0
    for d in deltas:
        for j, ch in enumerate(d):
            if ch == "\ufffd":
                assert final[pos + j] == "\ufffd"
        pos += len(d)


def one_by_one(ids: Sequence[int]) -> list[list[int]]:
    return [[i] for i in ids]


# --- decoding matches tokenizer.decode ------------------------------------------


@pytest.mark.parametrize("text", [ENGLISH, MULTIBYTE], ids=["english", "multibyte"])
def test_token_by_token_matches_decode(tok, text: str) -> None:
    ids = tok.encode(text)
    det = IncrementalDetokenizer(tok)
    deltas: list[str] = []
    for n, i in enumerate(ids, 1):
        assert det.append([i]) is None
        # output_text is always the full decode so far (with a U+FFFD tail if any).
        assert det.output_text == tok.decode(ids[:n], skip_special_tokens=True)
        deltas.append(det.next_delta())
        # A delta streamed before the end is final text: no broken character in it.
        assert "\ufffd" not in deltas[-1]
    deltas.append(det.next_delta(finished=True))
    assert "".join(deltas) == det.output_text == tok.decode(ids) == text
    if text == MULTIBYTE:
        # Some tokens end inside a character, so some steps must have held text back.
        assert "" in deltas[:-1]


def test_prompt_context(tok) -> None:
    prompt = tok.encode("The answer to everything is")
    ids = tok.encode(" 42, naïvely — 你好!")
    det = IncrementalDetokenizer(tok, prompt_token_ids=prompt)
    _, deltas, _ = run(det, one_by_one(ids))
    assert "".join(deltas) == det.output_text == tok.decode(ids) == " 42, naïvely — 你好!"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), skip=st.booleans())
def test_random_ids_match_decode(tok, partial_char_ids, data, skip: bool) -> None:
    vocab = len(tok)
    token = st.one_of(
        st.integers(0, vocab - 1),
        st.sampled_from(partial_char_ids),  # many split characters
        st.integers(0, 16),  # special tokens
    )
    ids = data.draw(st.lists(token, max_size=40), label="ids")
    sizes = data.draw(st.lists(st.integers(1, 3), min_size=len(ids), max_size=len(ids)))
    chunks, pos = [], 0
    for size in sizes:
        if pos >= len(ids):
            break
        chunks.append(ids[pos : pos + size])
        pos += size
    det = IncrementalDetokenizer(tok, skip_special_tokens=skip)
    deltas: list[str] = []
    seen: list[int] = []
    for chunk in chunks:
        assert det.append(chunk) is None
        seen += chunk
        assert det.output_text == tok.decode(seen, skip_special_tokens=skip)
        deltas.append(det.next_delta())
    deltas.append(det.next_delta(finished=True))
    final = tok.decode(ids, skip_special_tokens=skip)
    assert "".join(deltas) == det.output_text == final
    check_deltas_never_broken(deltas, final)


@pytest.mark.parametrize("skip", [True, False])
def test_special_tokens(tok, skip: bool) -> None:
    im_start, im_end, eot = 1, 2, 0
    ids = (
        [im_start]
        + tok.encode("assistant\nHi 你")
        + [im_end]
        + tok.encode(" there 😀")
        + [eot]
        + tok.encode("done")
    )
    # A special token between the bytes of one character.
    emoji = tok.encode("😀")
    ids += emoji[:1] + [im_end] + emoji[1:]
    det = IncrementalDetokenizer(tok, skip_special_tokens=skip)
    _, deltas, _ = run(det, one_by_one(ids))
    final = tok.decode(ids, skip_special_tokens=skip)
    assert "".join(deltas) == det.output_text == final
    assert ("<|im_end|>" in final) is not skip
    check_deltas_never_broken(deltas, final)


def test_incomplete_character_released_on_finish(tok) -> None:
    ids = tok.encode("ok 😀")[:-1]  # last token ends inside the emoji
    det = IncrementalDetokenizer(tok)
    _, deltas, _ = run(det, one_by_one(ids))
    assert det.output_text == tok.decode(ids)
    assert det.output_text.endswith("\ufffd")
    assert "\ufffd" not in "".join(deltas[:-1])
    assert deltas[-1].endswith("\ufffd")


def test_decode_window_stays_small(tok) -> None:
    ids = tok.encode(ENGLISH * 20)
    det = IncrementalDetokenizer(tok, prompt_token_ids=ids[:30])
    for i in ids:
        det.append([i])
        assert len(det._ids) <= 8  # the window, not the whole output
    assert det.output_text == tok.decode(ids)


# --- stop strings ------------------------------------------------------------------

SENTENCE = "Hello world. How are you today?"


def test_stop_mid_token(tok) -> None:
    ids = tok.encode(SENTENCE)
    assert "orl" not in [tok.decode([i]) for i in ids]  # "orl" lies inside " world"
    det = IncrementalDetokenizer(tok, stop=["orl"])
    stop, deltas, streamed = run(det, one_by_one(ids))
    assert stop == "orl"
    assert det.output_text == "Hello w"
    assert all("Hello w".startswith(s) for s in streamed)


def test_stop_spanning_token_end(tok) -> None:
    # The token " world" ends past the stop's end; the stop must still be found at once.
    ids = tok.encode(SENTENCE)
    det = IncrementalDetokenizer(tok, stop=["o w"])
    fed: list[int] = []
    for i in ids:
        fed.append(i)
        stop = det.append([i])
        if stop is not None:
            break
    assert stop == "o w"
    assert tok.decode(fed) == "Hello world"  # matched with the token " world"
    assert det.output_text == "Hell"


def test_stop_before_split_character(tok) -> None:
    # " \xf0\x9f\x98" (space + 3 bytes of the emoji) decodes to " \ufffd": the stop "ok "
    # is complete with that token although its character is not.
    ids = tok.encode("ok 😀 yes")
    assert tok.decode(ids[:2]) == "ok \ufffd"
    det = IncrementalDetokenizer(tok, stop=["ok "], include_stop_str_in_output=True)
    assert det.append(ids[:1]) is None
    assert det.next_delta() == ""  # "ok" may start the stop string
    assert det.append(ids[1:2]) == "ok "
    assert det.output_text == "ok "
    assert det.next_delta() == "ok "


def test_stop_at_token_boundary(tok) -> None:
    ids = tok.encode(SENTENCE)
    det = IncrementalDetokenizer(tok, stop=[" How"])
    stop, deltas, streamed = run(det, one_by_one(ids))
    assert stop == " How"
    assert det.output_text == "Hello world."
    assert "".join(deltas) == "Hello world."
    assert all("Hello world.".startswith(s) for s in streamed)


@pytest.mark.parametrize(
    ("stop_str", "expected"), [("orl", "Hello worl"), (" How", "Hello world. How")]
)
def test_include_stop_str_in_output(tok, stop_str: str, expected: str) -> None:
    det = IncrementalDetokenizer(tok, stop=[stop_str], include_stop_str_in_output=True)
    stop, deltas, streamed = run(det, one_by_one(tok.encode(SENTENCE)))
    assert stop == stop_str
    assert det.output_text == "".join(deltas) == expected
    assert all(expected.startswith(s) for s in streamed)


@pytest.mark.parametrize("stops", [["are", "world"], ["world", "are"]])
def test_multiple_stops_earliest_wins(tok, stops: list[str]) -> None:
    ids = tok.encode(SENTENCE)
    det = IncrementalDetokenizer(tok, stop=stops)
    assert det.append(ids) == "world"  # all at once: both match, "world" comes first
    assert det.output_text == "Hello "
    det = IncrementalDetokenizer(tok, stop=stops)
    stop, _, _ = run(det, one_by_one(ids))
    assert stop == "world"
    assert det.output_text == "Hello "


def test_streaming_never_shows_stop_prefix(tok) -> None:
    # Stops that share a long prefix with text that appears earlier ("How a" before "How are").
    text = "How about it? How are you? How are things?"
    ids = tok.encode(text)
    stops = ["How are things", "you?!", "zzz"]
    det = IncrementalDetokenizer(tok, stop=stops)
    stop, deltas, streamed = run(det, one_by_one(ids))
    assert stop == "How are things"
    final = "How about it? How are you? "
    assert det.output_text == "".join(deltas) == final
    # Every streamed prefix is part of the final text: no piece of the stop leaked.
    assert all(final.startswith(s) for s in streamed)
    # And text was held back while a stop could still complete.
    assert "How about it? How are you? How are" in [
        tok.decode(ids[:n]) for n in range(len(ids) + 1)
    ]
    assert all(not s.endswith("How are") for s in streamed)


def test_streaming_holds_back_only_stop_prefixes(tok) -> None:
    """Char-level check: with the text fed one token at a time, every streamed
    text equals the text so far minus its longest stop-prefix suffix, or less."""
    text = ENGLISH + MULTIBYTE
    ids = tok.encode(text)
    stops = ["lazy cat", "x ** 3", "世界！ 😀🎉👎"]
    det = IncrementalDetokenizer(tok, stop=stops)
    stop, deltas, streamed = run(det, one_by_one(ids))
    assert stop is None
    assert "".join(deltas) == text
    for n, s in enumerate(streamed, 1):
        so_far = tok.decode(ids[:n])
        assert so_far.startswith(s)
        rest = so_far[len(s) :]
        # What is held back is a stop prefix, then text ending in a broken character.
        assert any(
            (k == 0 or any(stop.startswith(rest[:k]) for stop in stops))
            and (k == len(rest) or rest.endswith("\ufffd"))
            for k in range(len(rest) + 1)
        ), (s, rest)


def test_partial_stop_at_end_released_on_finish(tok) -> None:
    ids = tok.encode("Hello world. How are you")
    det = IncrementalDetokenizer(tok, stop=["you there"])
    for i in ids:
        assert det.append([i]) is None
    streamed = det.next_delta()
    assert streamed == "Hello world. How are "
    assert det.next_delta() == ""
    assert det.next_delta(finished=True) == "you"
    assert det.output_text == "Hello world. How are you"


def test_append_after_stop_raises(tok) -> None:
    det = IncrementalDetokenizer(tok, stop=["world"])
    assert det.append(tok.encode(SENTENCE)) == "world"
    with pytest.raises(RuntimeError):
        det.append([1])
    with pytest.raises(RuntimeError):
        det.append([])
    # The text is final: everything left is released, even without finished=True.
    assert det.next_delta() == "Hello "
    assert det.next_delta(finished=True) == ""


def test_append_after_finished_raises(tok) -> None:
    det = IncrementalDetokenizer(tok)
    det.append(tok.encode("Hi"))
    assert det.next_delta(finished=True) == "Hi"
    with pytest.raises(RuntimeError):
        det.append([1])


def test_bad_arguments(tok) -> None:
    with pytest.raises(ValueError):
        IncrementalDetokenizer(tok, stop=[""])
    with pytest.raises(TypeError):
        IncrementalDetokenizer(tok, stop="stop")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        IncrementalDetokenizer(tok).append([-1])
