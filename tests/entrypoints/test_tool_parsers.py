"""Tool-call parsers: whole replies, and the same replies streamed in every
split, give the same content, names and arguments."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pagedrs.entrypoints.openai.tool_parsers import StreamDelta, get_tool_parser

WEATHER = '{"city": "Paris", "unit": "c\\"elsius", "days": [1, 2]}'

# (parser, reply, expected content, expected [(name, arguments object)])
CASES = [
    ("hermes", "Just text.", "Just text.", []),
    (
        "hermes",
        f'Let me check.\n<tool_call>\n{{"name": "get_weather", "arguments": {WEATHER}}}\n'
        "</tool_call>",
        "Let me check.",
        [("get_weather", json.loads(WEATHER))],
    ),
    (
        "hermes",
        '<tool_call>{"name": "a", "arguments": {}}</tool_call>\n'
        '<tool_call>{"arguments": {"x": 1}, "name": "b"}</tool_call>',
        None,
        [("a", {}), ("b", {"x": 1})],
    ),
    (
        "hermes",
        '<tool_call>{"name": "a", "arguments": "{\\"q\\": 2}"}</tool_call>',
        None,
        [("a", {"q": 2})],
    ),
    (
        "llama3_json",
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}',
        None,
        [("get_weather", {"city": "Oslo"})],
    ),
    (
        "llama3_json",
        '{"name": "a", "parameters": {"x": 1}}; {"name": "b", "parameters": {}}',
        None,
        [("a", {"x": 1}), ("b", {})],
    ),
    ("llama3_json", '{"answer": 42}', '{"answer": 42}', []),
    ("llama3_json", "The answer is {x}.", "The answer is {x}.", []),
    (
        "mistral",
        'Sure. [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Rome"}}, '
        '{"name": "t", "arguments": {}}]',
        "Sure.",
        [("get_weather", {"city": "Rome"}), ("t", {})],
    ),
    (
        "mistral",
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Rome"}[TOOL_CALLS]t[ARGS]{}',
        None,
        [("get_weather", {"city": "Rome"}), ("t", {})],
    ),
    ("mistral", "[TOOL_CALLS]not json", "[TOOL_CALLS]not json", []),
    (
        "pythonic",
        '[get_weather(city="Paris", days=[1, 2]), now()]',
        None,
        [("get_weather", {"city": "Paris", "days": [1, 2]}), ("now", {})],
    ),
    ("pythonic", "[1, 2, 3]", "[1, 2, 3]", []),
    ("pythonic", "Hello [world", "Hello [world", []),
]


def test_malformed_arguments() -> None:
    """Arguments that never close: the whole reply is content; streamed, the
    call's header and the characters written went out as they came, and the
    reply ends as a call whose arguments do not parse (the model's output cut
    short, as with finish_reason "length")."""
    reply = '<tool_call>{"name": "a", "arguments": {"x": </tool_call>'
    out = get_tool_parser("hermes").extract(reply)
    assert out.tool_calls == [] and out.content == reply
    content, calls = _stream("hermes", reply, list(range(1, len(reply))))
    assert content == "" and calls == {0: ["a", '{"x": </tool_call>']}


@pytest.mark.parametrize(("parser", "reply", "content", "calls"), CASES)
def test_extract(parser: str, reply: str, content: str | None, calls: list) -> None:
    out = get_tool_parser(parser).extract(reply)
    assert [(c.name, json.loads(c.arguments)) for c in out.tool_calls] == calls
    if calls:
        assert out.content == content
    else:
        assert out.content == reply


def _stream(parser: str, reply: str, cuts: list[int]) -> tuple[str, dict[int, list[str]]]:
    stream = get_tool_parser(parser).stream()
    pieces = [reply[a:b] for a, b in zip([0, *cuts], [*cuts, len(reply)], strict=True)]
    deltas: list[StreamDelta] = [stream.feed(p) for p in pieces] + [stream.finish()]
    content = "".join(d.content for d in deltas)
    calls: dict[int, list[str]] = {}
    for d in deltas:
        for c in d.tool_calls:
            if c.index not in calls:
                assert c.id and c.name, "a call's first piece carries its id and name"
                calls[c.index] = [c.name, ""]
            else:
                assert c.id is None and c.name is None
            calls[c.index][1] += c.arguments
    return content, calls


@settings(max_examples=60, deadline=None)
@given(data=st.data())
@pytest.mark.parametrize(("parser", "reply", "content", "calls"), CASES)
def test_streamed_equals_whole(
    parser: str, reply: str, content: str | None, calls: list, data: st.DataObject
) -> None:
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(reply) - 1)), max_size=len(reply))))
    got_content, got_calls = _stream(parser, reply, [c for c in cuts if c < len(reply)])
    assert [(n, json.loads(a)) for n, a in got_calls.values()] == calls
    if calls:
        assert got_content.strip() == (content or "")
    else:
        assert got_content == reply


def test_arguments_stream_in_pieces() -> None:
    reply = '<tool_call>{"name": "f", "arguments": {"text": "a long argument value"}}</tool_call>'
    stream = get_tool_parser("hermes").stream()
    pieces = [stream.feed(ch) for ch in reply]
    arg_pieces = [c.arguments for d in pieces for c in d.tool_calls if c.arguments]
    assert len(arg_pieces) > 10
    first = next(c for d in pieces for c in d.tool_calls)
    assert first.name == "f" and first.id is not None and first.id.startswith("call_")


def test_unknown_parser() -> None:
    with pytest.raises(ValueError, match="tool_call_parser 'nope'"):
        get_tool_parser("nope")


def test_mistral_ids() -> None:
    out = get_tool_parser("mistral").extract('[TOOL_CALLS]f[ARGS]{"a": 1}')
    assert len(out.tool_calls[0].id) == 9 and out.tool_calls[0].id.isalnum()


def test_call_array_shared() -> None:
    """One array reader serves mistral's ``[TOOL_CALLS][...]`` and the
    ``tool_choice="required"`` reply: the same calls from the same array; an
    empty array is no calls for mistral and not a reply for "required"; an
    object without a name is not a call for either."""
    from pagedrs.entrypoints.openai.chat_tools import CallArray

    array = '[{"name": "a", "parameters": {"x": 1}}, {"name": "b", "arguments": {}}]'
    required = CallArray().extract(array)
    mistral = get_tool_parser("mistral").extract("[TOOL_CALLS]" + array)
    for out in (required, mistral):
        assert [(c.name, json.loads(c.arguments)) for c in out.tool_calls] == [
            ("a", {"x": 1}),
            ("b", {}),
        ]
    assert CallArray().extract("[]").content == "[]"
    assert get_tool_parser("mistral").extract("[TOOL_CALLS][]").tool_calls == []
    nameless = '[{"parameters": {"x": 1}}]'
    assert CallArray().extract(nameless).tool_calls == []
    assert get_tool_parser("mistral").extract("[TOOL_CALLS]" + nameless).tool_calls == []
    content, calls = _stream("mistral", "[TOOL_CALLS]" + array, list(range(1, 40, 3)))
    assert [(n, json.loads(a)) for n, a in calls.values()] == [("a", {"x": 1}), ("b", {})]
