"""Structured outputs after the reasoning, on a server with ``--reasoning-parser
deepseek_r1`` and a chat template that opens a ``<think>`` block: the reasoning
is the model's own (the same text as without a constraint), the answer after
``</think>`` is held to the schema, for ``response_format`` and for a
constrained ``tool_choice``, streamed and not."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from agent_tools import MODEL, TEMPLATE
from pagedrs import EngineArgs
from pagedrs.engine.async_llm import AsyncLLM
from pagedrs.entrypoints.openai.api_server import build_app
from pagedrs.entrypoints.openai.chat_options import ChatOptions
from server_utils import ServerThread, all_blocks_free, torch_threads, wait_for

GENERATION_PROMPT = "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
# The tools template, with the assistant's turn opening a think block (as
# DeepSeek-R1's template does).
THINK_TEMPLATE = TEMPLATE.read_text().replace(
    GENERATION_PROMPT, "{%- if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
)
# One worked example, so that the 135M model reasons briefly and closes the block;
# its answer's keys are not the schema's.
MESSAGES: list[Any] = [
    {"role": "system", "content": "Think briefly inside <think></think>, then answer with JSON."},
    {"role": "user", "content": "Which city is the capital of France?"},
    {
        "role": "assistant",
        "content": '<think>\nThe capital of France is Paris.\n</think>{"city": "Paris", '
        '"population": 2100000}',
    },
    {"role": "user", "content": "Which city is the capital of Italy?"},
]
SCHEMA = {
    "type": "object",
    "properties": {
        "country": {"type": "string", "maxLength": 20},
        "capital": {"type": "string", "enum": ["Rome", "Paris", "Madrid", "Berlin"]},
    },
    "required": ["country", "capital"],
    "additionalProperties": False,
}
CAPITAL_TOOL: list[Any] = [
    {
        "type": "function",
        "function": {"name": "record_capital", "parameters": SCHEMA},
    }
]


@pytest.fixture(scope="module")
def server(default_model_dir: Path) -> Iterator[ServerThread]:
    assert THINK_TEMPLATE != TEMPLATE.read_text()
    engine = AsyncLLM(EngineArgs(model=str(default_model_dir), max_model_len=1024))
    options = ChatOptions(
        chat_template=THINK_TEMPLATE,
        enable_auto_tool_choice=True,
        tool_call_parser="hermes",
        reasoning_parser="deepseek_r1",
    )
    with torch_threads(1), ServerThread(build_app(engine, [MODEL], chat_options=options)) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=300)


def test_response_format_after_reasoning(client: openai.OpenAI) -> None:
    free = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=64, temperature=0.0
    )
    reasoning = free.choices[0].message.reasoning_content  # type: ignore[attr-defined]
    assert reasoning and "</think>" not in reasoning
    r = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=64,
        temperature=0.0,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "capital", "schema": SCHEMA},
        },
    )
    c = r.choices[0]
    assert c.finish_reason == "stop"
    assert c.message.reasoning_content == reasoning  # type: ignore[attr-defined]
    assert c.message.content is not None
    jsonschema.validate(json.loads(c.message.content), SCHEMA)


def test_required_tool_after_reasoning_streamed(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        tools=CAPITAL_TOOL,
        tool_choice="required",
        max_tokens=96,
        temperature=0.0,
        stream=True,
    )
    reasoning, content, args, names, finish = "", "", "", [], None
    for chunk in stream:
        for c in chunk.choices:
            reasoning += getattr(c.delta, "reasoning_content", None) or ""
            content += c.delta.content or ""
            for t in c.delta.tool_calls or []:
                if t.function and t.function.name:
                    names.append(t.function.name)
                args += (t.function.arguments if t.function else None) or ""
            finish = c.finish_reason or finish
    assert reasoning and "</think>" not in reasoning
    assert finish == "tool_calls" and names == ["record_capital"] and content == ""
    jsonschema.validate(json.loads(args), SCHEMA)


def test_reasoning_end_is_not_a_request_field(server: ServerThread) -> None:
    r = httpx.post(
        f"{server.url}/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": MESSAGES,
            "structured_outputs": {"json_object": True, "reasoning_end": "x"},
        },
        timeout=60,
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "structured_outputs"
    wait_for(lambda: all_blocks_free(server.url), what="every block free")
