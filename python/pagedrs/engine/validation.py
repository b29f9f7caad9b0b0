"""The checks of a request before it is queued: every front end (``LLMEngine``,
``AsyncLLM``, the OpenAI-compatible server) and the engine core (again, for
input that crossed a process boundary) run these, and nothing else. Each
refusal is an ``InvalidRequestError`` naming the field at fault (``param``)
and, where OpenAI has one, its ``code``."""

from __future__ import annotations

import numbers
from collections.abc import Sequence

from ..sampling_params import SamplingParams
from .core.errors import InvalidRequestError

__all__ = [
    "CONTEXT_LENGTH_EXCEEDED",
    "InvalidRequestError",
    "check_context_length",
    "check_params",
    "check_priority",
    "check_prompt",
    "check_prompt_chars",
    "out_of_vocab_error",
]

#: OpenAI's code of a prompt (plus output) longer than the context.
CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"


def check_priority(priority: int, scheduling_policy: str) -> None:
    """Raise unless ``priority`` is an integer the scheduling policy allows.

    Raises:
        InvalidRequestError: (param ``priority``) not an integer (numpy
            integers count), outside the signed 64-bit range, or non-zero
            under "fcfs" (as vLLM).
    """
    if not isinstance(priority, numbers.Integral) or isinstance(priority, bool):
        raise InvalidRequestError(
            f"priority must be an integer, got {priority!r}", param="priority"
        )
    if not -(2**63) <= int(priority) < 2**63:
        raise InvalidRequestError(
            f"priority must fit in a signed 64-bit integer, got {priority}", param="priority"
        )
    if priority != 0 and scheduling_policy != "priority":
        raise InvalidRequestError(
            f"got priority {priority}, but priority scheduling is not enabled "
            "(scheduling_policy='priority')",
            param="priority",
        )


def check_params(params: object, max_logprobs: int) -> None:
    """Raise unless ``params`` are ``SamplingParams`` within the engine's limits.

    Raises:
        TypeError: not ``SamplingParams``.
        InvalidRequestError: ``logprobs`` or ``prompt_logprobs`` over
            ``max_logprobs`` (a negative ``max_logprobs`` means no limit).
    """
    if not isinstance(params, SamplingParams):
        raise TypeError(f"params must be SamplingParams, got {type(params).__name__}")
    for name in ("logprobs", "prompt_logprobs"):
        k = getattr(params, name)
        if k is not None and 0 <= max_logprobs < k:
            raise InvalidRequestError(f"{name}={k} exceeds max_logprobs={max_logprobs}", param=name)


def check_prompt(
    prompt_token_ids: Sequence[int], max_model_len: int, vocab_size: int, param: str = "prompt"
) -> None:
    """Check a prompt's token ids: the length first (a long list is refused
    before its ids are scanned), then the vocabulary.

    Args:
        param: the request field holding the prompt (the server's ``messages``
            for a chat).
    Raises:
        InvalidRequestError: empty, over ``max_model_len - 1`` tokens (code
            ``context_length_exceeded``), or with ids outside ``[0, vocab_size)``.
    """
    if len(prompt_token_ids) == 0:
        raise InvalidRequestError(
            "the prompt is empty: it must have at least one token", param=param
        )
    check_context_length(len(prompt_token_ids), None, max_model_len, param)
    error = out_of_vocab_error(prompt_token_ids, vocab_size)
    if error is not None:
        raise InvalidRequestError(error, param=param)


def out_of_vocab_error(prompt_token_ids: Sequence[int], vocab_size: int) -> str | None:
    """The error message for the first id of a non-empty prompt outside
    ``[0, vocab_size)`` (the id and its position), or None when all are inside."""
    if min(prompt_token_ids) >= 0 and max(prompt_token_ids) < vocab_size:
        return None
    at, bad = next((i, t) for i, t in enumerate(prompt_token_ids) if not 0 <= t < vocab_size)
    return f"prompt token ids must be in [0, {vocab_size}), got {bad} at position {at}"


def check_context_length(
    num_prompt_tokens: int, max_tokens: int | None, max_model_len: int, param: str = "prompt"
) -> int:
    """The tokens a request may generate: ``max_tokens``, or the room left in
    the context when it is None (the server's default). The prompt plus at
    least one generated token must fit.

    Args:
        param: the request field holding the prompt (the server's ``messages``
            for a chat).
    Raises:
        InvalidRequestError: (code ``context_length_exceeded``) a prompt of
            ``max_model_len`` tokens or more (param ``param``; ``_core``'s rule
            in OpenAI's words), or prompt plus ``max_tokens`` over
            ``max_model_len`` (param ``max_tokens``).
    """
    if num_prompt_tokens >= max_model_len:
        raise InvalidRequestError(
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"prompt has {num_prompt_tokens} tokens: the prompt plus at least one generated "
            f"token must fit (max_model_len={max_model_len}).",
            param=param,
            code=CONTEXT_LENGTH_EXCEEDED,
        )
    if max_tokens is None:
        return max_model_len - num_prompt_tokens
    if num_prompt_tokens + max_tokens > max_model_len:
        raise InvalidRequestError(
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {num_prompt_tokens + max_tokens} tokens ({num_prompt_tokens} in the "
            f"prompt, {max_tokens} for the completion). Reduce the prompt or max_tokens.",
            param="max_tokens",
            code=CONTEXT_LENGTH_EXCEEDED,
        )
    return max_tokens


def check_prompt_chars(
    num_chars: int, max_chars_per_token: int, max_model_len: int, param: str = "prompt"
) -> None:
    """Refuse a prompt text by its length before tokenizing it: a text of more
    than ``max_chars_per_token * (max_model_len - 1)`` characters cannot fit.

    Args:
        num_chars: the text's characters that become tokens.
        max_chars_per_token: the most characters one token of the tokenizer
            stands for (``entrypoints.openai.tokenization.max_chars_per_token``).
    Raises:
        InvalidRequestError: (code ``context_length_exceeded``) too long.
    """
    if num_chars > max_chars_per_token * (max_model_len - 1):
        raise InvalidRequestError(
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"prompt has {num_chars} characters, more than {max_model_len - 1} tokens of this "
            f"model can hold (at most {max_chars_per_token} characters a token): "
            "the prompt plus at least one generated token must fit.",
            param=param,
            code=CONTEXT_LENGTH_EXCEEDED,
        )
