"""Reasoning parsers by vLLM's ``--reasoning-parser`` names."""

from __future__ import annotations

from .think_tags import (
    Qwen3ReasoningParser,
    ReasoningSplit,
    ReasoningStream,
    ThinkTagReasoningParser,
)

REASONING_PARSERS: dict[str, type[ThinkTagReasoningParser]] = {
    "deepseek_r1": ThinkTagReasoningParser,
    "qwen3": Qwen3ReasoningParser,
}


def get_reasoning_parser(name: str) -> ThinkTagReasoningParser:
    """The parser called ``name``.

    Raises:
        ValueError: an unknown name (the message lists the known ones).
    """
    if name not in REASONING_PARSERS:
        raise ValueError(f"reasoning_parser {name!r} is not one of {sorted(REASONING_PARSERS)}")
    return REASONING_PARSERS[name]()


__all__ = [
    "REASONING_PARSERS",
    "ReasoningSplit",
    "ReasoningStream",
    "ThinkTagReasoningParser",
    "get_reasoning_parser",
]
