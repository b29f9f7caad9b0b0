"""``--structured-tool-calls`` on the default model with the hermes parser: with
``"auto"`` every call the model starts (``<tool_call>``) parses and matches its
function's schema; ``"required"`` and a named function are hermes calls; a call
sent back in the history renders as the tokens the model generated (the forced
text is written as the tokenizer's tokens), so the next turn finds the whole
call in the prefix cache (``usage.prompt_tokens_details``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
from agent_tools import MODEL, SCHEMAS, TEMPLATE, TOOLS
from pagedrs import EngineArgs
from pagedrs.engine.async_llm import AsyncLLM
from pagedrs.entrypoints.openai.api_server import build_app
from pagedrs.entrypoints.openai.chat_options import ChatOptions
from server_utils import ServerThread, torch_threads

BLOCK = 16  # the engine's default block size
SYSTEM = (
    "You are a weather and time assistant. Answer only by calling the tools: for the "
    "weather call get_weather, for the time call get_time."
)
QUESTIONS = [
    "What is the weather in Paris?",
    "What time is it in Tokyo?",
    "Is it raining in London right now?",
]


@pytest.fixture(scope="module")
def client(default_model_dir: Path) -> Iterator[openai.OpenAI]:
    engine = AsyncLLM(EngineArgs(model=str(default_model_dir), max_model_len=1024))
    options = ChatOptions(
        chat_template=TEMPLATE.read_text(),
        enable_auto_tool_choice=True,
        tool_call_parser="hermes",
        structured_tool_calls=True,
    )
    with torch_threads(1), ServerThread(build_app(engine, [MODEL], chat_options=options)) as srv:
        yield openai.OpenAI(base_url=f"{srv.url}/v1", api_key="x", max_retries=0, timeout=900)


def _messages(question: str) -> list[Any]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


def test_options_need_a_parser_with_a_structural_form() -> None:
    with pytest.raises(ValueError, match="structural form"):
        ChatOptions(tool_call_parser="pythonic", structured_tool_calls=True)
    with pytest.raises(ValueError, match="structural form"):
        ChatOptions(structured_tool_calls=True)


def _check_sampled(client: openai.OpenAI, **kwargs: Any) -> int:
    """Sampled replies (3 questions x 3 samples, temperature 1): each one that
    starts a call ends with calls that parse and match their schemas, none is
    left in the content. Returns the number of calls."""
    num_calls = 0
    for i, question in enumerate(QUESTIONS):
        r = client.chat.completions.create(
            model=MODEL,
            messages=_messages(question),
            tools=TOOLS,
            temperature=1.0,
            seed=i,
            n=3,
            **kwargs,
        )
        for c in r.choices:
            if c.finish_reason == "length":
                continue  # cut inside a call: returned as content
            assert "<tool_call>" not in (c.message.content or "")
            for call in c.message.tool_calls or []:
                schema = SCHEMAS[call.function.name]
                jsonschema.validate(json.loads(call.function.arguments), schema)
                num_calls += 1
            assert (c.finish_reason == "tool_calls") == bool(c.message.tool_calls)
    return num_calls


def test_auto_calls_always_parse_and_match_the_schema(client: openai.OpenAI) -> None:
    """With ``"auto"`` the text is free: the calls the model starts (the 135M
    model starts few or none here) parse and match; the forced path below
    holds the model to the same tags until it has written a call."""
    _check_sampled(client, tool_choice="auto", max_tokens=64)


def test_sampled_required_calls_always_parse_and_match_the_schema(
    client: openai.OpenAI,
) -> None:
    """``"required"`` (the same triggered tags, at least one call, one call
    with ``parallel_tool_calls=False``): every sampled reply is one call that
    parses and matches its function's schema."""
    calls = _check_sampled(client, tool_choice="required", parallel_tool_calls=False, max_tokens=96)
    assert calls == len(QUESTIONS) * 3


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "get_time"}}]
)
def test_constrained_calls_are_hermes_calls(client: openai.OpenAI, choice: Any) -> None:
    for stream in (False, True):
        kwargs: dict[str, Any] = dict(
            model=MODEL,
            messages=_messages(QUESTIONS[0]),
            tools=TOOLS,
            tool_choice=choice,
            parallel_tool_calls=False,
            max_tokens=96,
            temperature=0.0,
        )
        if not stream:
            c = client.chat.completions.create(**kwargs).choices[0]
            calls = [(t.function.name, t.function.arguments) for t in c.message.tool_calls or []]
            finish, content = c.finish_reason, c.message.content
        else:
            parts: dict[int, list[str]] = {}
            finish, content = None, None
            for chunk in client.chat.completions.create(stream=True, **kwargs):
                for ch in chunk.choices:
                    finish = ch.finish_reason or finish
                    content = (content or "") + (ch.delta.content or "") or None
                    for d in ch.delta.tool_calls or []:
                        entry = parts.setdefault(d.index, ["", ""])
                        entry[0] += (d.function and d.function.name) or ""
                        entry[1] += (d.function and d.function.arguments) or ""
            calls = [(n, a) for n, a in parts.values()]
        assert finish == "tool_calls" and content is None
        assert len(calls) == 1
        name, arguments = calls[0]
        if isinstance(choice, dict):
            assert name == "get_time"
        jsonschema.validate(json.loads(arguments), SCHEMAS[name])


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "get_time"}}]
)
def test_next_turn_finds_the_call_in_the_prefix_cache(client: openai.OpenAI, choice: Any) -> None:
    """An agent's loop: the call the model wrote, sent back with its result,
    renders as the tokens it generated (the text the structural tag forces is
    written as the tokenizer's tokens: jump-forward decoding), so the next
    turn's cached tokens cover the first turn's prompt and call up to their
    last whole block."""
    messages = _messages(QUESTIONS[1])
    first = client.chat.completions.create(
        model=MODEL, messages=messages, tools=TOOLS, tool_choice=choice,
        parallel_tool_calls=False, max_tokens=96, temperature=0.0,
    )  # fmt: skip
    assert first.usage is not None and first.choices[0].message.tool_calls
    call = first.choices[0].message.tool_calls[0]
    messages.append(first.choices[0].message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "09:41 in Tokyo"})
    second = client.chat.completions.create(
        model=MODEL, messages=messages, tools=TOOLS, tool_choice="none", max_tokens=4
    )
    assert second.usage is not None and second.usage.prompt_tokens_details is not None
    written = first.usage.prompt_tokens + first.usage.completion_tokens
    # All of turn 1's tokens but its last one were computed; whole blocks are cached.
    assert second.usage.prompt_tokens_details.cached_tokens >= (written - 1) // BLOCK * BLOCK
