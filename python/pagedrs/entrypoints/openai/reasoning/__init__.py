"""Reasoning parsers by vLLM's ``--reasoning-parser`` names."""

from __future__ import annotations

from ..parsers import make_parser
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
    """The parser called ``name`` (``make_parser``'s errors)."""
    return make_parser(REASONING_PARSERS, "reasoning_parser", name)


__all__ = [
    "REASONING_PARSERS",
    "ReasoningSplit",
    "ReasoningStream",
    "ThinkTagReasoningParser",
    "get_reasoning_parser",
]
