"""Llama 3.x JSON tool calls: the reply is ``{"name": ..., "parameters": {...}}``
(optionally after ``<|python_tag|>``), several separated by ``;``."""

from __future__ import annotations

from .base import ToolParser
from .json_scan import PartialCall, partial_call, skip_ws

PYTHON_TAG = "<|python_tag|>"


class Llama3JsonToolParser(ToolParser):
    """``--tool-call-parser llama3_json``: a reply that opens with a JSON
    object (or the python tag) is a tool call; anything else is content."""

    name = "llama3_json"
    markers = (PYTHON_TAG, "{")

    def section_start(self, text: str) -> int | None:
        i = skip_ws(text, 0)
        if text.startswith(PYTHON_TAG, i) or text.startswith("{", i):
            return i
        return None

    def read_section(self, section: str, final: bool) -> list[PartialCall] | None:
        i = len(PYTHON_TAG) if section.startswith(PYTHON_TAG) else 0
        calls: list[PartialCall] = []
        while True:
            i = skip_ws(section, i)
            if i >= len(section):
                return None if final and not calls else calls
            if section[i] != "{":
                return None
            call = partial_call(section, i)
            if call is None or (call.end is not None and call.name is None):
                return None
            calls.append(call)
            if call.end is None:
                return None if final else calls
            i = skip_ws(section, call.end)
            if i < len(section):
                if section[i] != ";":
                    return None
                i += 1
