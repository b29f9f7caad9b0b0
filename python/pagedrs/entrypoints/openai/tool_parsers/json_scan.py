"""Scanning JSON text that may still be arriving: where a value ends, and the
parts of a ``{"name": ..., "arguments": ...}`` object seen so far.

A streamed tool call is a JSON object cut at any character. ``value_end``
finds the end of one JSON value without parsing it (string-aware brace and
bracket matching), or says it has not ended yet; ``partial_call`` reads the
name and the raw text of the arguments of an object that may be incomplete,
so that arguments stream as the exact characters the model wrote;
``read_call_array`` reads a JSON array of such objects.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

_WS = " \t\r\n"
_ARGUMENT_KEYS = ("arguments", "parameters")


def skip_ws(text: str, i: int) -> int:
    """The first index at or after ``i`` that is not JSON whitespace."""
    while i < len(text) and text[i] in _WS:
        i += 1
    return i


def string_end(text: str, i: int) -> int | None:
    """The index after the closing quote of the string opening at ``text[i]``
    (a ``"``), or None while it is open."""
    j = i + 1
    while j < len(text):
        c = text[j]
        if c == "\\":
            j += 2
            continue
        if c == '"':
            return j + 1
        j += 1
    return None


def value_end(text: str, i: int) -> int | None:
    """The index after the JSON value starting at ``text[i]``, or None while
    it may still grow (an open string, object or array, or a scalar that
    reaches the end of ``text``)."""
    if i >= len(text):
        return None
    c = text[i]
    if c == '"':
        return string_end(text, i)
    if c in "{[":
        depth = 0
        j = i
        while j < len(text):
            c = text[j]
            if c == '"':
                end = string_end(text, j)
                if end is None:
                    return None
                j = end
                continue
            if c in "{[":
                depth += 1
            elif c in "}]":
                depth -= 1
                if depth == 0:
                    return j + 1
            j += 1
        return None
    j = i
    while j < len(text) and text[j] not in ",}] \t\r\n;":
        j += 1
    return j if j < len(text) else None


@dataclass
class PartialCall:
    """What an object ``{"name": ..., "arguments": ...}`` shows so far.

    Attributes:
        name: the function name once its string is complete, else None.
        arguments: the raw text of the arguments value seen so far ("" before
            it starts); a JSON object's characters exactly as written.
        arguments_done: the arguments value is complete.
        end: index after the object's closing brace, None while it is open.
    """

    name: str | None
    arguments: str
    arguments_done: bool
    end: int | None


def partial_call(text: str, i: int) -> PartialCall | None:
    """Read the object opening at ``text[i]`` (a ``{``) as far as it goes.

    Keys other than ``name`` and ``arguments`` / ``parameters`` are skipped.
    Returns None when the text at ``i`` is not such an object (a value that
    is not a string name, a key that is not a string)."""
    call = PartialCall(None, "", False, None)
    j = skip_ws(text, i + 1)
    while j < len(text):
        if text[j] == "}":
            call.end = j + 1
            return call
        if text[j] == ",":
            j = skip_ws(text, j + 1)
            continue
        if text[j] != '"':
            return None
        key_end = string_end(text, j)
        if key_end is None:
            return call
        key = json.loads(text[j:key_end])
        j = skip_ws(text, key_end)
        if j >= len(text):
            return call
        if text[j] != ":":
            return None
        j = skip_ws(text, j + 1)
        if j >= len(text):
            return call
        end = value_end(text, j)
        if key == "name":
            if text[j] != '"':
                return None
            if end is None:
                return call
            call.name = json.loads(text[j:end])
        elif key in _ARGUMENT_KEYS:
            if end is None:
                # A string argument value is only usable once complete.
                call.arguments = "" if text[j] == '"' else text[j:]
                return call
            call.arguments, call.arguments_done = _arguments_text(text[j:end]), True
        elif end is None:
            return call
        j = skip_ws(text, end if end is not None else len(text))
    return call


def read_call_array(
    text: str, i: int, final: bool, allow_empty: bool = True
) -> list[PartialCall] | None:
    """Read the JSON array of call objects opening at ``text[i]`` (a ``[``) as
    far as it goes: ``[{"name": ..., "arguments": ...}, ...]``.

    Args:
        final: ``text`` is the whole reply (an array still open is not calls).
        allow_empty: an empty array ``[]`` reads as no calls rather than None.
    Returns:
        the calls so far (the last one may be open), or None when the text is
        not such an array: an item that is not an object, an object that is
        not a call (see ``partial_call``), a closed object without a name, an
        empty array unless ``allow_empty``, or an open array when ``final``.
    """
    calls: list[PartialCall] = []
    i = skip_ws(text, i + 1)
    while i < len(text):
        if text[i] == "]":
            return calls if calls or allow_empty else None
        if text[i] == ",":
            i = skip_ws(text, i + 1)
            continue
        if text[i] != "{":
            return None
        call = partial_call(text, i)
        if call is None or (call.end is not None and call.name is None):
            return None
        calls.append(call)
        if call.end is None:
            break
        i = skip_ws(text, call.end)
    return None if final else calls


def _arguments_text(raw: str) -> str:
    """Arguments as JSON object text: a string holding JSON is unwrapped."""
    if raw.startswith('"'):
        inner = json.loads(raw)
        return inner if isinstance(inner, str) else json.dumps(inner)
    return raw
