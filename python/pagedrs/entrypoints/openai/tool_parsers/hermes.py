"""Hermes / Qwen tool calls: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``,
one block per call, after any content."""

from __future__ import annotations

import json
from typing import Any

from ....structured_output import json_schema_ebnf
from .base import ToolParser
from .json_scan import PartialCall, partial_call, skip_ws

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class HermesToolParser(ToolParser):
    """``--tool-call-parser hermes``."""

    name = "hermes"
    markers = (OPEN,)

    def section_start(self, text: str) -> int | None:
        i = text.find(OPEN)
        return None if i < 0 else i

    def structural_tag(
        self, schemas: dict[str, dict[str, Any]], *, required: bool, single: bool
    ) -> dict[str, Any] | None:
        """After ``<tool_call>``: ``\\n{"name": "<function>", "arguments": <JSON
        valid against its schema>}\\n</tool_call>``, the layout and JSON
        spacing (``json_schema_ebnf``) Qwen's and the shipped ``chatml_tools``
        templates render a call in, so a call written under this constraint
        reads back from the history as the same tokens (prefix-cache hits)."""
        tags = [
            {
                "type": "tag",
                "begin": f'{OPEN}\n{{"name": {json.dumps(name)}, "arguments": ',
                "content": {"type": "grammar", "grammar": json_schema_ebnf(schema)},
                "end": f"}}\n{CLOSE}",
            }
            for name, schema in schemas.items()
        ]
        return {
            "type": "structural_tag",
            "format": {
                "type": "triggered_tags",
                "triggers": [OPEN],
                "tags": tags,
                "at_least_one": required,
                "stop_after_first": single,
            },
        }

    def read_section(self, section: str, final: bool) -> list[PartialCall] | None:
        """Blocks in order; text after the last complete block is not part of
        the calls (as vLLM's hermes parser)."""
        calls: list[PartialCall] = []
        i = 0
        while True:
            i = skip_ws(section, i)
            if i >= len(section):
                return calls
            if not section.startswith(OPEN, i):
                if not final and OPEN.startswith(section[i:]):
                    return calls
                return calls or None
            i = skip_ws(section, i + len(OPEN))
            if i >= len(section):
                return None if final else calls
            if section[i] != "{":
                return None
            call = partial_call(section, i)
            if call is None:
                return None
            calls.append(call)
            if call.end is None:
                return None if final else calls
            i = skip_ws(section, call.end)
            if section.startswith(CLOSE, i):
                i += len(CLOSE)
                continue
            if i >= len(section) or (not final and CLOSE.startswith(section[i:])):
                return calls
            return None
