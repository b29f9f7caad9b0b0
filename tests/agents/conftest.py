"""The server agent tests share: the default model served with a tools chat
template, auto tool choice and the hermes parser (one engine for the folder)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from agent_tools import MODEL, TEMPLATE
from pagedrs import EngineArgs
from pagedrs.engine.async_llm import AsyncLLM
from pagedrs.entrypoints.openai.api_server import build_app
from pagedrs.entrypoints.openai.chat_options import ChatOptions
from server_utils import ServerThread, torch_threads


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
