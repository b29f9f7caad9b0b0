"""Mistral tool calls: ``[TOOL_CALLS]`` followed by a JSON array of
``{"name": ..., "arguments": {...}}`` objects, or (tokenizer v11 and later)
by ``name[ARGS]{...}``, repeated per call."""

from __future__ import annotations

import json
import random
import string

from .base import ToolParser
from .json_scan import PartialCall, read_call_array, skip_ws, value_end

TOOL_CALLS, ARGS = "[TOOL_CALLS]", "[ARGS]"
_ID_CHARS = string.ascii_letters + string.digits


class MistralToolParser(ToolParser):
    """``--tool-call-parser mistral``; call ids are 9 letters and digits, the
    form Mistral's chat templates require of ``tool_call_id``."""

    name = "mistral"
    markers = (TOOL_CALLS,)

    def new_call_id(self) -> str:
        return "".join(random.choices(_ID_CHARS, k=9))

    def section_start(self, text: str) -> int | None:
        i = text.find(TOOL_CALLS)
        return None if i < 0 else i

    def read_section(self, section: str, final: bool) -> list[PartialCall] | None:
        i = skip_ws(section, len(TOOL_CALLS))
        if i >= len(section):
            return None if final else []
        if section[i] == "[" and not section.startswith(ARGS, i):
            return read_call_array(section, i, final)
        return _read_named(section, final)


def _read_named(section: str, final: bool) -> list[PartialCall] | None:
    """``[TOOL_CALLS]name[ARGS]{...}`` blocks, in order."""
    calls: list[PartialCall] = []
    for block in section.split(TOOL_CALLS)[1:]:
        at = block.find(ARGS)
        if at < 0:
            if final or not _name_ok(block.strip()):
                return None
            break
        name = block[:at].strip()
        if not _name_ok(name) or not name:
            return None
        j = skip_ws(block, at + len(ARGS))
        end = value_end(block, j) if j < len(block) else None
        if end is None:
            if final:
                return None
            calls.append(
                PartialCall(name, block[j:] if block[j : j + 1] == "{" else "", False, None)
            )
            break
        raw = block[j:end]
        try:
            json.loads(raw)
        except ValueError:
            return None
        calls.append(PartialCall(name, raw, True, end))
    return calls


def _name_ok(name: str) -> bool:
    return all(c.isalnum() or c in "_-." for c in name)
