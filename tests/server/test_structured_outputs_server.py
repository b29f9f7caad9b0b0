"""Structured outputs through the ``openai`` client on the default model: OpenAI's
``response_format`` (json_schema strict, json_object) and vLLM's ``guided_*`` /
``structured_outputs`` fields, on both endpoints, streamed and not; bad schemas are
a 400 naming the field."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import openai
import pytest
from pagedrs import EngineArgs
from pagedrs.engine.async_llm import AsyncLLM
from pagedrs.entrypoints.openai.api_server import build_app
from server_utils import ServerThread, all_blocks_free, torch_threads, wait_for

MODEL = "smollm2"
CITY = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 24},
        "country": {"type": "string", "maxLength": 24},
        "population": {"type": "integer", "minimum": 0, "maximum": 100000000},
    },
    "required": ["city", "country", "population"],
    "additionalProperties": False,
}
ASK_CITY = [{"role": "user", "content": "Describe Paris as JSON."}]


@pytest.fixture(scope="module")
def server(default_model_dir: Path) -> Iterator[ServerThread]:
    engine = AsyncLLM(EngineArgs(model=str(default_model_dir), max_model_len=512))
    with torch_threads(1), ServerThread(build_app(engine, [MODEL])) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=120)


def _schema_format(strict: bool = True) -> dict:
    return {
        "type": "json_schema",
        "json_schema": {"name": "city", "schema": CITY, "strict": strict},
    }


def test_chat_json_schema_strict_n2(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=MODEL,
        messages=ASK_CITY,
        response_format=_schema_format(),  # type: ignore[arg-type]
        max_tokens=64,
        temperature=0.8,
        seed=7,
        n=2,
    )
    assert len(r.choices) == 2
    for c in r.choices:
        assert c.finish_reason == "stop"
        jsonschema.validate(json.loads(c.message.content or ""), CITY)


def test_chat_json_object_and_completion_json_schema(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": 'Return {"ok": true} as JSON.'}],
        response_format={"type": "json_object"},
        max_tokens=64,
        temperature=0,
    )
    assert isinstance(json.loads(r.choices[0].message.content or ""), dict)
    c = client.completions.create(
        model=MODEL,
        prompt="A city described as JSON:",
        max_tokens=64,
        temperature=0,
        extra_body={"response_format": _schema_format(strict=False)},
    )
    jsonschema.validate(json.loads(c.choices[0].text), CITY)


def test_guided_choice_and_regex(client: openai.OpenAI) -> None:
    choices = ["positive", "negative"]
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Is 'I love it' positive or negative?"}],
        max_tokens=8,
        temperature=0.7,
        n=3,
        seed=1,
        extra_body={"guided_choice": choices},
    )
    assert all(c.message.content in choices for c in r.choices)
    c = client.completions.create(
        model=MODEL,
        prompt="My phone number is",
        max_tokens=16,
        temperature=0,
        extra_body={"guided_regex": r" ?\d{3}-\d{4}"},
    )
    assert re.fullmatch(r" ?\d{3}-\d{4}", c.choices[0].text)
    g = client.completions.create(
        model=MODEL,
        prompt="2 + 2 =",
        max_tokens=8,
        temperature=0,
        extra_body={"structured_outputs": {"grammar": 'root ::= " " [0-9]+'}},
    )
    assert re.fullmatch(r" [0-9]+", g.choices[0].text)


def test_streamed_deltas_concatenate_to_valid_json(client: openai.OpenAI) -> None:
    chunks = client.chat.completions.create(
        model=MODEL,
        messages=ASK_CITY,
        max_tokens=64,
        temperature=0,
        stream=True,
        extra_body={"guided_json": CITY},
    )
    pieces, reasons = [], []
    for ch in chunks:
        for c in ch.choices:
            pieces.append(c.delta.content or "")
            reasons.append(c.finish_reason)
    assert len([p for p in pieces if p]) > 3  # really streamed
    assert reasons[-1] == "stop"
    jsonschema.validate(json.loads("".join(pieces)), CITY)
    stream = client.completions.create(
        model=MODEL,
        prompt="A city described as JSON:",
        max_tokens=64,
        temperature=0,
        stream=True,
        extra_body={"structured_outputs": {"json": json.dumps(CITY)}},
    )
    jsonschema.validate(json.loads("".join(ch.choices[0].text for ch in stream)), CITY)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x",
                                                                     "schema": {"type": 3}}}},
         "response_format"),
        ({"guided_json": {"properties": {"a": {"$ref": "#/missing"}}}}, "guided_json"),
        ({"guided_regex": "[z-a]"}, "guided_regex"),
        ({"guided_choice": ["a"], "guided_regex": "a"}, "guided_choice"),
    ],
)  # fmt: skip
def test_invalid_structured_outputs_are_400(
    client: openai.OpenAI, server: ServerThread, body: dict, param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model=MODEL, messages=ASK_CITY, max_tokens=8, extra_body=body
        )
    assert err.value.status_code == 400
    error = err.value.body
    assert isinstance(error, dict) and error["param"] == param, error
    wait_for(lambda: all_blocks_free(server.url))
