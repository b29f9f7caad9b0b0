"""The server's tokenizer: prompts are tokenized and chat templates rendered off the
event loop, and a prompt whose length in characters already proves it cannot fit
the context is refused before any tokenizing.

Two worker threads, each with its own copy of the tokenizer (a HF fast tokenizer
must not be shared by threads while it encodes): one for short texts (at most
``SHORT_TEXT_CHARS`` characters) and one for long ones, so that a long prompt
being tokenized never queues a short one behind it. HF's Rust tokenizers release
the GIL while they encode, so the event loop keeps serving meanwhile.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import json
import math
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from ...engine.validation import InvalidRequestError, check_prompt_chars
from .errors import OpenAIError, bad_request, invalid_request

T = TypeVar("T")

# Texts up to this many characters go to the short lane: about 40 ms of tokenizing.
SHORT_TEXT_CHARS = 32768

# The most characters one character of normalized text can stand for under NFC or
# NFKC. Decompositions never shorten text (no character decomposes to nothing), and
# canonical composition turns a run into one character only when that run is the
# character's full canonical decomposition, at most 4 code points long (UAX #15).
_COMPOSITION_SHRINK = 4

# Pre-tokenizers that drop no character (Split and Punctuation unless "Removed").
_KEEPING_PRE_TOKENIZERS = {"ByteLevel", "Metaspace", "Digits", "UnicodeScripts"}


def _normalizer_shrink(n: dict[str, Any] | None) -> int | None:
    """How many input characters one normalized character can stand for, or None
    when the normalizer may delete characters or shorten text without bound."""
    if n is None:
        return 1
    kind = n.get("type")
    if kind == "Sequence":
        shrink = 1
        for child in n.get("normalizers", []):
            s = _normalizer_shrink(child)
            if s is None:
                return None
            shrink *= s
        return shrink
    if kind in ("NFD", "NFKD", "Prepend"):
        return 1
    if kind in ("NFC", "NFKC"):
        return _COMPOSITION_SHRINK
    if kind == "Replace":
        pattern = (n.get("pattern") or {}).get("String")
        content = n.get("content")
        if pattern and isinstance(content, str) and len(content) >= len(pattern):
            return 1
    return None  # Strip, Lowercase, Precompiled, BertNormalizer, regex Replace, ...


def _pre_tokenizer_keeps(p: dict[str, Any] | None) -> bool:
    """Whether the pre-tokenizer keeps every character (only splits or maps it to
    at least one symbol)."""
    if p is None:
        return True
    kind = p.get("type")
    if kind == "Sequence":
        return all(_pre_tokenizer_keeps(c) for c in p.get("pretokenizers", []))
    if kind in ("Split", "Punctuation"):
        return p.get("behavior") != "Removed"
    return kind in _KEEPING_PRE_TOKENIZERS


def _byte_level_symbols() -> list[str]:
    """The symbol ByteLevel pre-tokenization gives each byte 0-255 (GPT-2's map:
    printable Latin-1 bytes stand for themselves, the other bytes in order for
    the code points from 256 up)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    symbols: dict[int, str] = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in symbols:
            symbols[b] = chr(256 + extra)
            extra += 1
    return [symbols[b] for b in range(256)]


def _tokenizer_spec(tokenizer: Any) -> dict[str, Any] | None:
    """The ``tokenizers`` JSON of a HF fast tokenizer, or None for any other."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    try:
        spec = json.loads(backend.to_str())
    except Exception:
        return None
    return spec if isinstance(spec, dict) else None


def _is_byte_level(p: dict[str, Any] | None) -> bool:
    if p is None:
        return False
    if p.get("type") == "Sequence":
        return any(_is_byte_level(c) for c in p.get("pretokenizers", []))
    return p.get("type") == "ByteLevel"


def dropped_chars(tokenizer: Any) -> str | None:
    """The characters the tokenizer may turn into no token at all, or None when it
    may drop characters it cannot list (then no prompt is refused by its length).

    A BPE model without an unknown token silently drops a symbol missing from its
    vocabulary. Under ByteLevel pre-tokenization the symbols are the 256 bytes' own,
    and a character vanishes only when every byte of its UTF-8 form is missing: a
    missing ASCII byte's character (SmolLM2 drops ``"\\x16"``); a character of
    several bytes keeps its continuation bytes (0x80-0xBF) when they are all in the
    vocabulary (missing lead bytes, such as 0xC0 or 0xF5-0xFF that UTF-8 never uses,
    then drop nothing whole). With an unknown token nothing is dropped.
    """
    spec = _tokenizer_spec(tokenizer)
    if spec is None:
        return None
    model = spec.get("model") or {}
    if model.get("unk_token") is not None:
        return ""
    if not _is_byte_level(spec.get("pre_tokenizer")):
        return None
    vocab = model.get("vocab") or {}
    missing = [b for b, sym in enumerate(_byte_level_symbols()) if sym not in vocab]
    if any(0x80 <= b <= 0xBF for b in missing):
        return None
    return "".join(chr(b) for b in missing if b < 0x80)


def max_chars_per_token(tokenizer: Any) -> int | None:
    """The most characters of a prompt that one token can stand for, or None when
    the tokenizer gives no such bound.

    Why the bound holds: a normalizer of the kinds accepted here turns ``c`` input
    characters into at least ``c / shrink`` characters (``shrink`` = 4 under NFC /
    NFKC, else 1); the accepted pre-tokenizers map each of those to at least one
    symbol (itself, ``▁`` for a space, or its 1-4 UTF-8 bytes under ByteLevel) and
    drop none; a BPE token is a concatenation of symbols, so it stands for at most
    as many symbols as its own length; an unknown character becomes one unknown
    token (unless unknowns are fused, refused here without a full byte fallback);
    an added token matches its own content (one that strips neighbouring
    whitespace is refused, since it can eat any run of spaces); the post-processor
    only adds tokens. So a prompt of ``n`` tokens has at most
    ``n * shrink * longest token`` characters.

    Args:
        tokenizer: a HF fast tokenizer (``backend_tokenizer`` is the ``tokenizers``
            object); anything else gets None.
    """
    spec = _tokenizer_spec(tokenizer)
    if spec is None:
        return None
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        return None  # WordPiece / WordLevel / Unigram: an unknown token covers a whole word
    vocab: dict[str, int] = model.get("vocab") or {}
    if model.get("unk_token") is not None and model.get("fuse_unk"):
        byte_tokens = {f"<0x{b:02X}>" for b in range(256)}
        if not (model.get("byte_fallback") and byte_tokens <= vocab.keys()):
            return None
    shrink = _normalizer_shrink(spec.get("normalizer"))
    if shrink is None or not _pre_tokenizer_keeps(spec.get("pre_tokenizer")):
        return None
    added = spec.get("added_tokens") or []
    if any(a.get("lstrip") or a.get("rstrip") for a in added):
        return None
    longest = max([len(t) for t in vocab] + [len(a.get("content", "")) for a in added], default=0)
    if longest < 1:
        return None
    return shrink * longest


class ServerTokenizer:
    """Tokenizing and chat templates for the server's handlers, on worker threads.

    Args:
        tokenizer: the HF tokenizer to copy (one copy per worker thread; the
            original is never used by them).
        max_model_len: the context length, in tokens.
    """

    def __init__(
        self, tokenizer: Any, max_model_len: int, chat_template: str | None = None
    ) -> None:
        self.max_model_len = max_model_len
        self.chat_template: str | None = chat_template or getattr(tokenizer, "chat_template", None)
        dropped = dropped_chars(tokenizer)
        per_token = None if dropped is None else max_chars_per_token(tokenizer)
        self.max_chars_per_token = per_token
        # Characters that may become no token do not count toward the bound.
        self.dropped = dropped or ""
        # A prompt that fits has at most max_model_len - 1 tokens (one is generated).
        self.max_prompt_chars: float = (
            math.inf if per_token is None else per_token * (max_model_len - 1)
        )
        self._lanes = [
            ThreadPoolExecutor(
                1,
                thread_name_prefix=f"pagedrs-tokenizer-{name}",
                initializer=_set_thread_tokenizer,
                initargs=(copy.deepcopy(tokenizer),),
            )
            for name in ("short", "long")
        ]

    def check_chars(self, text: str, param: str) -> None:
        """Refuse a prompt ``text`` whose characters cannot fit the context.

        Raises:
            OpenAIError: 400 ``context_length_exceeded``.
        """
        if len(text) <= self.max_prompt_chars:
            return
        num_chars = len(text) - sum(text.count(c) for c in self.dropped)
        assert self.max_chars_per_token is not None  # else max_prompt_chars is inf
        try:
            check_prompt_chars(num_chars, self.max_chars_per_token, self.max_model_len, param)
        except InvalidRequestError as exc:
            raise invalid_request(exc) from None

    async def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``.

        Raises:
            OpenAIError: 400 when ``text`` is too long to fit (checked first).
        """
        self.check_chars(text, "prompt")
        return await self._run(len(text), _encode, text, add_special_tokens)

    async def render_chat(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool,
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> tuple[str, list[int]]:
        """The chat template (``chat_template``) applied to ``messages`` (and
        ``tools``, extra template variables ``template_kwargs``), and its token
        ids (no special tokens added: the template holds them).

        Raises:
            OpenAIError: 400 for a template error or a rendered prompt too long to fit.
        """
        size = sum(len(m.get("content") or "") for m in messages)
        return await self._run(
            size, self._render, messages, add_generation_prompt, tools, template_kwargs or {}
        )

    async def decode(self, token_ids: list[int]) -> str:
        """The text of ``token_ids``."""
        return await self._run(len(token_ids), _decode, token_ids)

    async def token_strs(self, token_ids: list[int]) -> list[str]:
        """Each id's token as the vocabulary spells it."""
        return await self._run(len(token_ids), _token_strs, token_ids)

    def shutdown(self) -> None:
        """Stop the worker threads (queued work is dropped)."""
        for lane in self._lanes:
            lane.shutdown(wait=False, cancel_futures=True)

    async def _run(self, size: int, fn: Callable[..., T], *args: Any) -> T:
        lane = self._lanes[0 if size <= SHORT_TEXT_CHARS else 1]
        return await asyncio.get_running_loop().run_in_executor(lane, functools.partial(fn, *args))

    def _render(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool,
        tools: list[dict[str, Any]] | None,
        template_kwargs: dict[str, Any],
    ) -> tuple[str, list[int]]:
        tok = _local.tokenizer
        try:
            text = tok.apply_chat_template(
                messages,
                tools=tools,
                chat_template=self.chat_template,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                **template_kwargs,
            )
        except Exception as exc:
            raise bad_request(f"the chat template failed: {exc}", "messages") from None
        if not isinstance(text, str):
            raise OpenAIError(500, "the chat template did not render text", type="server_error")
        self.check_chars(text, "messages")
        return text, list(tok(text, add_special_tokens=False).input_ids)


# Each worker thread's own tokenizer (set by the executor's initializer).
_local = threading.local()


def _set_thread_tokenizer(tokenizer: Any) -> None:
    _local.tokenizer = tokenizer


def _encode(text: str, add_special_tokens: bool) -> list[int]:
    return list(_local.tokenizer(text, add_special_tokens=add_special_tokens).input_ids)


def _decode(token_ids: list[int]) -> str:
    return str(_local.tokenizer.decode(token_ids))


def _token_strs(token_ids: list[int]) -> list[str]:
    return [str(t) for t in _local.tokenizer.convert_ids_to_tokens(token_ids)]
