"""Incremental detokenization with stop strings, as vLLM / OpenAI users expect.

Tokens arrive one (or a few) at a time; :class:`IncrementalDetokenizer` turns them
into text without decoding the whole output at every step, finds stop strings as
soon as they appear, and hands out *deltas* that are safe to stream: never part of a
stop string that may still complete, never half of a multi-byte character.

Decoding uses the prefix_offset / read_offset technique (as in vLLM and TGI): the
ids are decoded in a small window ``ids[prefix_offset:]`` that starts a few tokens
before the new ones, and the new text is what that window adds to the decode of
``ids[prefix_offset:read_offset]``. The leading tokens give the decoder its context
(leading spaces of sentencepiece / BPE tokens, bytes of a character split over
tokens). While the window's text ends in U+FFFD (an incomplete UTF-8 sequence) the
offsets stay put and the new tokens are held as a *pending* tail until the next
tokens complete it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["IncrementalDetokenizer"]

# Prompt tokens decoded as context before the first output token.
_PROMPT_CONTEXT_TOKENS = 5
_REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    """Turns generated token ids into text, a few tokens at a time.

    Each :meth:`append` costs two decodes of a window of a few tokens (the tokens
    since the last-but-one step that produced complete text), whatever the length
    of the output so far; stop strings are searched only in the new text plus the
    ``max(len(stop)) - 1`` characters before it. (The window grows only while the
    text keeps ending in U+FFFD, e.g. during a run of invalid byte tokens.)

    ``output_text`` equals ``tokenizer.decode(output_ids, skip_special_tokens=...)``
    for byte-level BPE tokenizers (and whenever the prompt ends on a complete
    character); for sentencepiece-style tokenizers it keeps the leading space of the
    first output token, which a standalone decode strips. The tokenizer's
    ``clean_up_tokenization_spaces`` is not applied (it cannot be done incrementally).

    Args:
        tokenizer: a HF (transformers) tokenizer (``PreTrainedTokenizerFast``); its
            ``backend_tokenizer`` is used directly when present, else ``decode``.
        prompt_token_ids: the prompt's token ids (context for correct decoding of the
            first output tokens, e.g. leading spaces with sentencepiece/BPE); only
            the last few are kept.
        skip_special_tokens: drop special tokens from the text.
        stop: stop strings (``list[str]``, may be empty).
        include_stop_str_in_output: keep the matched stop string at the end of the
            text.

    Raises:
        TypeError: if ``stop`` is a single ``str`` rather than a list of strings.
        ValueError: if a stop string is empty.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        prompt_token_ids: Sequence[int] = (),
        skip_special_tokens: bool = True,
        stop: Sequence[str] = (),
        include_stop_str_in_output: bool = False,
    ) -> None:
        if isinstance(stop, str):
            raise TypeError(f"stop must be a list of strings, not the string {stop!r}")
        stops = list(dict.fromkeys(stop))  # dedupe, keep order
        if any(not isinstance(s, str) or not s for s in stops):
            raise ValueError(f"stop strings must be non-empty strings, got {stops!r}")
        self._stops: list[str] = stops
        self._max_stop_len: int = max((len(s) for s in stops), default=0)
        # Every proper prefix of a stop string (held back from streaming).
        self._stop_prefixes: frozenset[str] = frozenset(
            s[:i] for s in stops for i in range(1, len(s))
        )
        self._include_stop: bool = include_stop_str_in_output
        self._skip_special: bool = skip_special_tokens
        self._decode: Callable[[list[int]], str] = self._make_decoder(tokenizer)

        # Token window: prompt context, then output ids; older ids are dropped.
        context = [int(t) for t in prompt_token_ids[-_PROMPT_CONTEXT_TOKENS:]]
        self._ids: list[int] = context
        self._prefix_offset: int = 0
        self._read_offset: int = len(context)
        self._prefix_text: str = self._decode(context) if context else ""

        self._text: str = ""  # stable text: complete characters, never changes
        self._pending: str = ""  # text of ids[read_offset:]; ends with U+FFFD
        self._searched: int = 0  # self._text[:_searched] holds no stop string
        self._returned: int = 0  # characters of output_text given out by next_delta
        self._stop_str: str | None = None
        self._finished: bool = False

    def _make_decoder(self, tokenizer: PreTrainedTokenizerBase) -> Callable[[list[int]], str]:
        skip = self._skip_special
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is not None:
            return lambda ids: backend.decode(ids, skip_special_tokens=skip)

        def decode(ids: list[int]) -> str:
            text = tokenizer.decode(
                ids, skip_special_tokens=skip, clean_up_tokenization_spaces=False
            )
            if not isinstance(text, str):
                raise TypeError(f"{type(tokenizer).__name__}.decode returned {type(text).__name__}")
            return text

        return decode

    def append(self, token_ids: Sequence[int]) -> str | None:
        """Add newly generated token ids (usually 1).

        Args:
            token_ids: the new token ids, in order (may be empty). Ids the tokenizer
                does not know decode to nothing, as in ``tokenizer.decode``.

        Returns:
            The stop string matched (generation must stop), or None. Once a stop
            string matched, ``output_text`` is cut just before it (or just after it
            with ``include_stop_str_in_output``).

        Raises:
            RuntimeError: if a stop string already matched, or ``next_delta`` was
                called with ``finished=True``.
            ValueError: if a token id is negative.
        """
        if self._stop_str is not None:
            raise RuntimeError(
                f"append after stop string {self._stop_str!r} matched: generation must stop"
            )
        if self._finished:
            raise RuntimeError("append after next_delta(finished=True)")
        new_ids = [int(t) for t in token_ids]
        if not new_ids:
            return None
        if min(new_ids) < 0:
            raise ValueError(f"token ids must be non-negative, got {new_ids}")
        self._ids.extend(new_ids)

        window_text = self._decode(self._ids[self._prefix_offset :])
        if len(window_text) > len(self._prefix_text) and not window_text.endswith(
            _REPLACEMENT_CHAR
        ):
            # Complete characters: commit them and slide the window forward.
            self._text += window_text[len(self._prefix_text) :]
            self._pending = ""
            new_prefix = self._read_offset
            del self._ids[:new_prefix]
            self._prefix_offset = 0
            self._read_offset = len(self._ids)
            self._prefix_text = self._decode(self._ids)
        else:
            # Nothing new yet, or an incomplete character: wait for more tokens.
            self._pending = window_text[len(self._prefix_text) :]

        if self._stops:
            return self._check_stop()
        return None

    def _check_stop(self) -> str | None:
        """Search the unsearched text (and the pending tail's complete characters)
        for stop strings; on a match, cut the text and finish."""
        visible_pending = self._pending.rstrip(_REPLACEMENT_CHAR)
        start = max(0, self._searched - (self._max_stop_len - 1))
        region = self._text[start:] + visible_pending
        best: tuple[int, int, str] | None = None  # (index, length, stop)
        for s in self._stops:
            i = region.find(s)
            if i >= 0 and (best is None or (i, len(s)) < best[:2]):
                best = (i, len(s), s)
        # The pending tail is searched again next time: it is not yet stable.
        self._searched = len(self._text)
        if best is None:
            return None
        index, length, stop_str = best
        end = start + index + (length if self._include_stop else 0)
        self._text = (self._text + visible_pending)[:end]
        self._pending = ""
        self._stop_str = stop_str
        return stop_str

    @property
    def output_text(self) -> str:
        """All text so far (final once finished); may still end with a held-back tail
        (a possible stop-string prefix, or an incomplete character as U+FFFD)."""
        return self._text + self._pending

    def next_delta(self, finished: bool = False) -> str:
        """Text not yet returned that is safe to stream.

        Never a prefix of any stop string that may still complete (the longest
        suffix of the text that is a prefix of a stop string is held back), never a
        broken multi-byte character (text ending in U+FFFD from an incomplete UTF-8
        sequence is held back). Once a stop string matched, the text is final and
        everything left is released.

        Args:
            finished: generation is over: release everything left (the final text
                minus what was already returned); later ``append`` calls raise.

        Returns:
            The new text (possibly empty). The concatenation of all deltas, ending
            with a ``finished=True`` call, equals ``output_text`` exactly.
        """
        if finished:
            self._finished = True
        if finished or self._stop_str is not None:
            text = self.output_text
            delta = text[self._returned :]
            self._returned = len(text)
            return delta
        limit = len(self._text) - self._held_stop_prefix_len()
        if limit <= self._returned:
            return ""
        delta = self._text[self._returned : limit]
        self._returned = limit
        return delta

    def _held_stop_prefix_len(self) -> int:
        """Length of the longest suffix of the stable text that is a proper prefix
        of a stop string (0 if none)."""
        text = self._text
        for k in range(min(len(text), self._max_stop_len - 1), 0, -1):
            if text[-k:] in self._stop_prefixes:
                return k
        return 0
