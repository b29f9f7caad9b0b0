"""Request bodies are validated as OpenAI validates them, before any engine work."""

from __future__ import annotations

import pytest
from pagedrs.entrypoints.openai.protocol import ChatCompletionRequest
from pydantic import ValidationError


@pytest.mark.parametrize("role", ["user", "system", "developer", "tool"])
def test_message_content_is_required_except_for_assistant(role: str) -> None:
    with pytest.raises(ValidationError, match="content is required"):
        ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": role}]})
    message = {"role": role, "content": "hi"}
    if role == "tool":
        message["tool_call_id"] = "call_1"  # a tool message names the call it answers
    ok = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "assistant"}, message]}
    )
    assert ok.messages[1].content == "hi"
