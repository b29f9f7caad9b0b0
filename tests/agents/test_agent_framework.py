"""OpenAI's Agents SDK (``openai-agents``) running a two-tool task end to end
against the server, over the Responses API (its default) and over Chat
Completions: the agent calls a tool (the first turn constrained with
``tool_choice="required"``, which the SDK resets afterwards), runs it, sends
the result, and ends with a text answer."""

from __future__ import annotations

import asyncio

import pytest
from agent_tools import MODEL, client, server  # noqa: F401 (fixtures)
from server_utils import ServerThread

agents = pytest.importorskip("agents")


@pytest.mark.parametrize("api", ["responses", "chat_completions"])
def test_two_tool_agent(server: ServerThread, api: str) -> None:
    from openai import AsyncOpenAI

    calls: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        calls.append(f"weather:{city}")
        return f"It is 22 degrees and sunny in {city}."

    @agents.function_tool
    def get_time(timezone: str) -> str:
        """The current time in a timezone."""
        calls.append(f"time:{timezone}")
        return f"It is 14:00 in {timezone}."

    client = AsyncOpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=120)
    model: agents.Model
    if api == "responses":
        model = agents.OpenAIResponsesModel(model=MODEL, openai_client=client)
    else:
        model = agents.OpenAIChatCompletionsModel(model=MODEL, openai_client=client)
    agent = agents.Agent(
        name="assistant",
        instructions="Use the tools to answer.",
        tools=[get_weather, get_time],
        model=model,
        model_settings=agents.ModelSettings(
            tool_choice="required", temperature=0.0, max_tokens=256
        ),
    )
    agents.set_tracing_disabled(True)
    result = asyncio.run(
        agents.Runner.run(agent, "What is the weather in Paris and the time there?", max_turns=4)
    )
    assert calls, "the agent ran at least one of the tools"
    assert isinstance(result.final_output, str) and result.final_output
    tool_outputs = [i for i in result.new_items if i.type == "tool_call_output_item"]
    assert len(tool_outputs) == len(calls)
