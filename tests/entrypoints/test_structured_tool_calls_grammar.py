"""``--structured-tool-calls`` without a model: the hermes structural tag
accepts a call exactly as the tools chat template renders it back (so the
history repeats the generated text) and nothing else after ``<tool_call>``;
``plan_tools`` picks it for ``"auto"``, ``"required"`` and a named function."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pagedrs.entrypoints.openai as openai_pkg
import pytest
import xgrammar as xgr
from pagedrs.entrypoints.openai.chat_options import ChatOptions
from pagedrs.entrypoints.openai.chat_tools import plan_tools
from pagedrs.entrypoints.openai.protocol import ChatCompletionRequest
from pagedrs.entrypoints.openai.tool_parsers import HermesToolParser
from pagedrs.structured_output import GrammarSpec
from transformers import AutoTokenizer

TEMPLATE = (Path(openai_pkg.__file__).parent / "chat_templates" / "chatml_tools.jinja").read_text()
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME = {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]}
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
TOOLS = [{"type": "function", "function": {"name": n, "parameters": s}} for n, s in SCHEMAS.items()]


def _accepts(tag: dict[str, Any], text: str) -> bool:
    grammar = xgr.Grammar.from_structural_tag(json.dumps(tag))
    return xgr.testing._is_grammar_accept_string(grammar, text)


@pytest.fixture(scope="module")
def tokenizer(default_model_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(default_model_dir)


def _rendered_calls(
    tok: Any, calls: list[tuple[str, dict[str, Any]]], content: str | None = None
) -> str:
    """What the template writes for an assistant turn after its generation prompt."""
    message = {
        "role": "assistant",
        "content": content,
        "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": a}}
            for i, (n, a) in enumerate(calls)
        ],
    }
    head = [{"role": "user", "content": "hi"}]
    text = tok.apply_chat_template(
        [*head, message], tools=TOOLS, chat_template=TEMPLATE, tokenize=False
    )
    prompt = tok.apply_chat_template(
        head, tools=TOOLS, chat_template=TEMPLATE, tokenize=False, add_generation_prompt=True
    )
    assert text.startswith(prompt) and text.endswith("<|im_end|>\n")
    return text[len(prompt) : -len("<|im_end|>\n")]


@pytest.mark.parametrize("single", [True, False])
def test_required_tag_accepts_the_template_rendering(tokenizer: Any, single: bool) -> None:
    tag = HermesToolParser().structural_tag(SCHEMAS, required=True, single=single)
    assert tag is not None
    one = _rendered_calls(tokenizer, [("get_weather", {"city": "Paris", "unit": "celsius"})])
    two = _rendered_calls(
        tokenizer,
        [("get_weather", {"city": "Oslo", "unit": "celsius"}), ("get_time", {"tz": "CET"})],
    )
    assert one == (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'
        "\n</tool_call>"
    )
    assert _accepts(tag, one)
    assert _accepts(tag, two) is not single  # one call only when single
    # Other spacing, an unknown tool, an argument off the schema, text before the call.
    assert not _accepts(tag, one.replace('"city": ', '"city":'))
    assert not _accepts(tag, one.replace("get_weather", "get_wether"))
    assert not _accepts(tag, one.replace("celsius", "kelvin"))
    assert not _accepts(tag, "Sure. " + one)


def test_auto_tag_constrains_only_after_the_start_tag(tokenizer: Any) -> None:
    tag = HermesToolParser().structural_tag(SCHEMAS, required=False, single=False)
    assert tag is not None
    call = _rendered_calls(tokenizer, [("get_time", {"tz": "UTC"})])
    assert _accepts(tag, "It is sunny.")
    assert _accepts(tag, "Let me check.\n" + call)
    assert not _accepts(tag, "Let me check.\n" + call.replace('"tz"', '"zone"'))
    assert not _accepts(tag, "<tool_call>\nnot json</tool_call>")


def _plan(body: dict[str, Any], structured: bool) -> Any:
    req = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS, **body}
    )
    options = ChatOptions(
        chat_template=TEMPLATE,
        enable_auto_tool_choice=True,
        tool_call_parser="hermes",
        structured_tool_calls=structured,
    )
    return plan_tools(req, options, TEMPLATE)


def test_plan_tools_with_and_without_the_flag() -> None:
    named = {"tool_choice": {"type": "function", "function": {"name": "get_time"}}}
    for body, mode in (({}, "auto"), ({"tool_choice": "required"}, "required"), (named, "named")):
        plan = _plan(body, structured=True)
        assert plan.mode == mode and plan.parser.name == "hermes"
        assert plan.structured is not None and plan.structured.kind == "structural_tag"
        spec = GrammarSpec.from_params(plan.structured)
        assert spec.kind == "structural_tag"
        spec.build()
        off = _plan(body, structured=False)
        assert off.mode == mode
        assert off.structured is None if mode == "auto" else off.structured.kind == "json"
    tag = _plan(named, structured=True).structured.structural_tag
    assert [t["begin"] for t in tag["format"]["tags"]] == [
        '<tool_call>\n{"name": "get_time", "arguments": '
    ]
    assert tag["format"]["at_least_one"] and tag["format"]["stop_after_first"]
    single = _plan({"tool_choice": "required", "parallel_tool_calls": False}, structured=True)
    assert single.structured.structural_tag["format"]["stop_after_first"]
    many = _plan({"tool_choice": "required"}, structured=True)
    assert not many.structured.structural_tag["format"]["stop_after_first"]
