"""Tool-call parsers by vLLM's ``--tool-call-parser`` names."""

from __future__ import annotations

from ..parsers import make_parser
from .base import (
    ExtractedToolCalls,
    StreamDelta,
    ToolCall,
    ToolCallDelta,
    ToolCallStream,
    ToolParser,
)
from .hermes import HermesToolParser
from .llama3_json import Llama3JsonToolParser
from .mistral import MistralToolParser
from .pythonic import PythonicToolParser

TOOL_PARSERS: dict[str, type[ToolParser]] = {
    p.name: p
    for p in (HermesToolParser, Llama3JsonToolParser, MistralToolParser, PythonicToolParser)
}


def get_tool_parser(name: str) -> ToolParser:
    """The parser called ``name`` (``make_parser``'s errors)."""
    return make_parser(TOOL_PARSERS, "tool_call_parser", name)


__all__ = [
    "TOOL_PARSERS",
    "ExtractedToolCalls",
    "StreamDelta",
    "ToolCall",
    "ToolCallDelta",
    "ToolCallStream",
    "ToolParser",
    "get_tool_parser",
]
