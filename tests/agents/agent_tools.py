"""The tools, prompts and server of the agent tests: the default model served
with a tools chat template, auto tool choice and the hermes parser (fixtures
``server`` and ``client``, imported by each test module)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pagedrs.entrypoints.openai as openai_pkg
import pytest
from pagedrs import EngineArgs
from pagedrs.engine.async_llm import AsyncLLM
from pagedrs.entrypoints.openai.api_server import build_app
from pagedrs.entrypoints.openai.chat_options import ChatOptions
from server_utils import ServerThread, torch_threads

MODEL = "smollm2"
TEMPLATE = Path(openai_pkg.__file__).parent / "chat_templates" / "chatml_tools.jinja"
WEATHER_ARGS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME_ARGS = {
    "type": "object",
    "properties": {"timezone": {"type": "string", "maxLength": 20}},
    "required": ["timezone"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city.",
            "parameters": WEATHER_ARGS,
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "The current time in a timezone.",
            "parameters": TIME_ARGS,
        },
    },
]
SCHEMAS = {"get_weather": WEATHER_ARGS, "get_time": TIME_ARGS}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="session")
def server(default_model_dir: Path) -> Iterator[ServerThread]:
    engine = AsyncLLM(EngineArgs(model=str(default_model_dir), max_model_len=1024))
    options = ChatOptions(
        chat_template=TEMPLATE.read_text(),
        enable_auto_tool_choice=True,
        tool_call_parser="hermes",
    )
    with torch_threads(1), ServerThread(build_app(engine, [MODEL], chat_options=options)) as srv:
        yield srv


@pytest.fixture(scope="session")
def client(server: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=120)
