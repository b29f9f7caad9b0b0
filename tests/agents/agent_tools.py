"""The tools and prompts of the agent tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pagedrs.entrypoints.openai as openai_pkg

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
