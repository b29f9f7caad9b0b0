"""``POST /v1/responses`` through the ``openai`` SDK: text, a function call
loop with ``function_call_output``, streaming events, ``previous_response_id``
from the in-memory store, and bad input as 400s naming the field."""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from agent_tools import MODEL, WEATHER_ARGS, client, server  # noqa: F401 (fixtures)
from server_utils import ServerThread, all_blocks_free, wait_for

FLAT_TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": WEATHER_ARGS,
    }
]
NAMED = {"type": "function", "name": "get_weather"}


def test_text(client: openai.OpenAI) -> None:
    r = client.responses.create(
        model=MODEL,
        input="Name one river.",
        instructions="Answer briefly.",
        max_output_tokens=12,
        temperature=0.0,
    )
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.status in ("completed", "incomplete")
    assert r.output_text and r.output[0].type == "message"
    assert r.usage is not None and r.usage.output_tokens <= 12
    again = client.responses.retrieve(r.id)
    assert again.output_text == r.output_text


def test_function_call_loop(client: openai.OpenAI) -> None:
    first = client.responses.create(
        model=MODEL,
        input=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=FLAT_TOOLS,
        tool_choice=NAMED,  # type: ignore[arg-type]
        max_output_tokens=64,
        temperature=0.0,
        store=False,
    )
    calls = [o for o in first.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER_ARGS)
    follow = client.responses.create(
        model=MODEL,
        input=[
            {"role": "user", "content": "What is the weather in Paris?"},
            {
                "type": "function_call",
                "call_id": calls[0].call_id,
                "name": calls[0].name,
                "arguments": calls[0].arguments,
            },
            {"type": "function_call_output", "call_id": calls[0].call_id, "output": "22 C"},
        ],
        tools=FLAT_TOOLS,
        tool_choice="none",
        max_output_tokens=16,
    )
    assert follow.output_text
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=MODEL, input="x", previous_response_id=first.id)
    assert isinstance(err.value.body, dict) and err.value.body["param"] == "previous_response_id"


def test_streaming_events_and_continuation(client: openai.OpenAI) -> None:
    events = list(
        client.responses.create(
            model=MODEL,
            input="What is the weather in Oslo?",
            tools=FLAT_TOOLS,
            tool_choice=NAMED,  # type: ignore[arg-type]
            max_output_tokens=64,
            temperature=0.0,
            stream=True,
        )
    )
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "response.output_item.added" in kinds
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert deltas == done.arguments
    jsonschema.validate(json.loads(deltas), WEATHER_ARGS)
    final = events[-1].response  # type: ignore[union-attr]
    call = next(o for o in final.output if o.type == "function_call")
    assert call.arguments == deltas
    # The stored response continues with the call's result.
    follow = client.responses.create(
        model=MODEL,
        previous_response_id=final.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "3 C"}],
        tools=FLAT_TOOLS,
        tool_choice="none",
        max_output_tokens=16,
    )
    assert follow.previous_response_id == final.id and follow.output_text


@pytest.mark.parametrize(
    ("body", "param", "text"),
    [
        ({"input": "x", "tools": [{"type": "web_search"}]}, "tools", "'web_search'"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input", "'item_reference'"),
        ({"input": "x", "previous_response_id": "resp_nope"}, "previous_response_id", "nope"),
        (
            {"input": "x", "tools": FLAT_TOOLS, "tool_choice": {"type": "function", "name": "n"}},
            "tool_choice",
            "'n'",
        ),
    ],
)
def test_bad_input(server: ServerThread, body: dict, param: str, text: str) -> None:
    r = httpx.post(f"{server.url}/v1/responses", json={"model": MODEL, **body}, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and text in error["message"]
    wait_for(lambda: all_blocks_free(server.url), what="every block free")
