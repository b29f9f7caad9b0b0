"""Prompt schemas named as in vLLM's ``vllm.inputs``: ``LLM.generate`` and
``LLM.beam_search`` take them wherever a prompt goes. They are TypedDicts, so a
plain dict with the same keys works the same."""

from __future__ import annotations

import sys
from typing import TypedDict

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

__all__ = ["PromptType", "SingletonPrompt", "TextPrompt", "TokensPrompt"]
