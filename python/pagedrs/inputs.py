"""Prompt schemas named as in vLLM's ``vllm.inputs``: ``LLM.generate`` and
``LLM.beam_search`` take them wherever a prompt goes. They are TypedDicts, so a
plain dict with the same keys works the same."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, TypedDict

if sys.version_info >= (3, 11):
    from typing import NotRequired
else:  # a dependency of torch and pydantic
    from typing_extensions import NotRequired


class TextPrompt(TypedDict):
    """A text prompt, tokenized by the engine.

    Keys:
        prompt: the text.
        cache_salt: optional; requests with different salts never share
            prefix-cache blocks.
    """

    prompt: str
    cache_salt: NotRequired[str]


class TokensPrompt(TypedDict):
    """An already tokenized prompt.

    Keys:
        prompt_token_ids: the token ids, passed to the model as they are.
        prompt: optional; the text they came from, reported in
            ``RequestOutput.prompt`` (a pagedrs extra; vLLM has no such key).
        cache_salt: optional; as in ``TextPrompt``.
    """

    prompt_token_ids: list[int]
    prompt: NotRequired[str]
    cache_salt: NotRequired[str]


SingletonPrompt = str | list[int] | TextPrompt | TokensPrompt
"""One prompt: text, token ids, or one of the dicts above."""

PromptType = SingletonPrompt
"""What ``LLM.generate`` takes per prompt (vLLM's name; no encoder-decoder prompts)."""


def parse_prompt(p: Any) -> tuple[str | None, list[int] | None, str | None]:
    """Split one prompt (text, token ids, or a ``TextPrompt`` / ``TokensPrompt``
    dict) into ``(text, token_ids, cache_salt)``; any may be None, never both
    text and token ids.

    Raises:
        ValueError: a dict with neither ``prompt`` nor ``prompt_token_ids``.
        TypeError: anything else than the types above.
    """
    if isinstance(p, dict):
        text = p.get("prompt")
        ids = p.get("prompt_token_ids")
        if text is None and ids is None:
            raise ValueError("a prompt dict needs 'prompt' or 'prompt_token_ids'")
        salt = p.get("cache_salt")
        return (
            None if text is None else str(text),
            None if ids is None else list(ids),
            None if salt is None else str(salt),
        )
    if isinstance(p, str):
        return p, None, None
    if isinstance(p, Sequence) and all(isinstance(t, int) for t in p):
        return None, list(p), None
    raise TypeError(f"a prompt must be a str, a list of token ids or a dict, got {type(p)}")


__all__ = ["PromptType", "SingletonPrompt", "TextPrompt", "TokensPrompt", "parse_prompt"]
