"""Tool calling on the default model through the ``openai`` client: a named
function and ``"required"`` are constrained to calls whose arguments match the
schema, streamed and not; ``"auto"`` reads the reply with the hermes parser;
the SDK's tool loop (call, run, send the result, answer); bad tools are 400s
naming the field, with nothing queued."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
import pytest
from agent_tools import ASK, MODEL, SCHEMAS, TIME_ARGS, TOOLS, client, server  # noqa: F401 (fixtures)
from server_utils import ServerThread, all_blocks_free, wait_for


def _check_call(name: str, arguments: str) -> None:
    jsonschema.validate(json.loads(arguments), SCHEMAS[name])


def test_named_function(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=MODEL,
        messages=ASK,  # type: ignore[arg-type]
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=64,
        temperature=0.7,
        seed=3,
        n=2,
    )
    for c in r.choices:
        assert c.finish_reason == "tool_calls"
        calls = c.message.tool_calls or []
        assert len(calls) == 1 and calls[0].function.name == "get_weather"
        assert calls[0].id.startswith("call_") and calls[0].type == "function"
        _check_call("get_weather", calls[0].function.arguments)
        assert c.message.content is None


def test_required_streamed_equals_whole(client: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = dict(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=96, seed=5
    )
    whole = client.chat.completions.create(temperature=0.0, **kwargs)
    calls = whole.choices[0].message.tool_calls or []
    assert calls and whole.choices[0].finish_reason == "tool_calls"
    for call in calls:
        _check_call(call.function.name, call.function.arguments)
    stream = client.chat.completions.create(temperature=0.0, stream=True, **kwargs)
    streamed: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in stream:
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for d in choice.delta.tool_calls or []:
                if d.index not in streamed:
                    assert d.id and d.function and d.function.name, "id and name come first"
                    streamed[d.index] = {"name": d.function.name, "arguments": ""}
                streamed[d.index]["arguments"] += (d.function and d.function.arguments) or ""
    assert finish == "tool_calls"
    assert [(c["name"], json.loads(c["arguments"])) for c in streamed.values()] == [
        (c.function.name, json.loads(c.function.arguments)) for c in calls
    ]


def test_required_single_call_without_parallel(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=MODEL,
        messages=ASK,  # type: ignore[arg-type]
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=96,
        temperature=0.0,
    )
    assert len(r.choices[0].message.tool_calls or []) == 1


def test_auto_answers_or_calls(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Say hello."}],
        tools=TOOLS,
        max_tokens=24,
        temperature=0.0,
    )
    c = r.choices[0]
    if c.message.tool_calls:
        assert c.finish_reason == "tool_calls"
        for call in c.message.tool_calls:
            assert call.function.name in SCHEMAS
            json.loads(call.function.arguments)
    else:
        assert c.message.content and "<tool_call>" not in c.message.content


def test_tool_loop(client: openai.OpenAI) -> None:
    """The SDK's loop: the model calls, the client runs the function and sends
    the result back with the call in the history, the model answers."""
    messages: list[Any] = list(ASK)
    first = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=64,
        temperature=0.0,
    )
    call = (first.choices[0].message.tool_calls or [])[0]
    args = json.loads(call.function.arguments)
    messages.append(first.choices[0].message.model_dump(exclude_none=True))
    messages.append(
        {"role": "tool", "tool_call_id": call.id, "content": f"22 degrees in {args['city']}"}
    )
    answer = client.chat.completions.create(
        model=MODEL, messages=messages, tools=TOOLS, tool_choice="none", max_tokens=24
    )
    assert answer.choices[0].message.content
    assert not answer.choices[0].message.tool_calls


@pytest.mark.parametrize(
    ("body", "param", "text"),
    [
        (
            {"tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
            "'nope'",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}]},
            "tools",
            "JSON Schema",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "tool", "content": "42"},
                ]
            },
            "messages",
            "tool_call_id",
        ),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools", "'a b'"),
        ({"tools": None, "tool_choice": "required"}, "tool_choice", "needs tools"),
    ],
)
def test_bad_tools(
    server: ServerThread, client: openai.OpenAI, body: dict, param: str, text: str
) -> None:
    request: dict[str, Any] = {"messages": ASK, "tools": TOOLS, "max_tokens": 4, **body}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, **request)
    error = err.value.body
    assert isinstance(error, dict) and error.get("param") == param, error
    assert text in error["message"]
    wait_for(lambda: all_blocks_free(server.url), what="every block free")


def test_tools_over_context_length(client: openai.OpenAI) -> None:
    long_tool = {
        "type": "function",
        "function": {"name": "f", "description": "word " * 3000, "parameters": TIME_ARGS},
    }
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model=MODEL,
            messages=ASK,
            tools=[long_tool],
            max_tokens=4,  # type: ignore[list-item]
        )
    assert isinstance(err.value.body, dict)
    assert err.value.body.get("code") == "context_length_exceeded"


def test_tokenize_detokenize(server: ServerThread, client: openai.OpenAI) -> None:
    """vLLM's /tokenize and /detokenize: a prompt's ids round-trip, a
    conversation's ids are the prompt a chat completion counts."""
    import httpx

    text = "PagedAttention stores KV in blocks."
    r = httpx.post(f"{server.url}/tokenize", json={"prompt": text, "return_token_strs": True})
    body = r.json()
    assert r.status_code == 200 and body["count"] == len(body["tokens"]) > 3
    assert len(body["token_strs"]) == body["count"] and body["max_model_len"] == 1024
    back = httpx.post(f"{server.url}/detokenize", json={"model": MODEL, "tokens": body["tokens"]})
    assert back.json()["prompt"].strip() == text
    chat = httpx.post(f"{server.url}/tokenize", json={"messages": ASK, "tools": TOOLS}).json()
    r2 = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=TOOLS,
        tool_choice="none",
        max_tokens=1,  # type: ignore
    )
    assert r2.usage is not None and chat["count"] == r2.usage.prompt_tokens
    bad = httpx.post(f"{server.url}/detokenize", json={"tokens": [1, 10**9]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
    assert "1000000000 at position 1" in bad.json()["error"]["message"]
