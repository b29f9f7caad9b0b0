"""Checks of a request before it is queued, shared by the in-process engine and
the front end of the engine-core process (which refuses bad input before it
crosses to the core)."""

from __future__ import annotations

import numbers
from collections.abc import Sequence

from .. import _core
from ..sampling_params import SamplingParams


def check_priority(priority: int, scheduling_policy: str) -> None:
    """Raise unless ``priority`` is an integer the scheduling policy allows.

    Raises:
        ValueError: not an integer (numpy integers count), outside the signed
            64-bit range, or non-zero under "fcfs" (as vLLM).
    """
    if not isinstance(priority, numbers.Integral) or isinstance(priority, bool):
        raise ValueError(f"priority must be an integer, got {priority!r}")
    if not -(2**63) <= int(priority) < 2**63:
        raise ValueError(f"priority must fit in a signed 64-bit integer, got {priority}")
    if priority != 0 and scheduling_policy != "priority":
        raise ValueError(
            f"got priority {priority}, but priority scheduling is not enabled "
            "(scheduling_policy='priority')"
        )


def check_params(params: object, max_logprobs: int) -> None:
    """Raise unless ``params`` are ``SamplingParams`` within the engine's limits.

    Raises:
        TypeError: not ``SamplingParams``.
        ValueError: ``logprobs`` or ``prompt_logprobs`` over ``max_logprobs``
            (a negative ``max_logprobs`` means no limit).
    """
    if not isinstance(params, SamplingParams):
        raise TypeError(f"params must be SamplingParams, got {type(params).__name__}")
    for name in ("logprobs", "prompt_logprobs"):
        k = getattr(params, name)
        if k is not None and 0 <= max_logprobs < k:
            raise ValueError(f"{name}={k} exceeds max_logprobs={max_logprobs}")


def check_prompt(prompt_token_ids: Sequence[int], max_model_len: int, vocab_size: int) -> None:
    """Check a prompt's token ids.

    Raises:
        ValueError: empty, over ``max_model_len - 1`` tokens, or with ids
            outside ``[0, vocab_size)``.
    """
    _core.check_prompt(len(prompt_token_ids), max_model_len)
    error = out_of_vocab_error(prompt_token_ids, vocab_size)
    if error is not None:
        raise ValueError(error)


def out_of_vocab_error(prompt_token_ids: Sequence[int], vocab_size: int) -> str | None:
    """The error message for the first id of a non-empty prompt outside
    ``[0, vocab_size)`` (the id and its position), or None when all are inside."""
    if min(prompt_token_ids) >= 0 and max(prompt_token_ids) < vocab_size:
        return None
    at, bad = next((i, t) for i, t in enumerate(prompt_token_ids) if not 0 <= t < vocab_size)
    return f"prompt token ids must be in [0, {vocab_size}), got {bad} at position {at}"
