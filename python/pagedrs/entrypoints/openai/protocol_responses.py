"""Request models of OpenAI's Responses API (``POST /v1/responses``).

Input is a string (one user message) or a list of items: messages
(``role`` + ``content`` as text or ``input_text`` / ``output_text`` parts),
``function_call`` items the model made earlier and ``function_call_output``
items answering them; ``reasoning`` items are accepted and not shown to the
model again (as OpenAI's stateless mode). Function tools only; other tool
types are refused by name.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from .protocol import JsonSchemaFormat, OpenAIRequestModel


class ResponsesFunctionTool(OpenAIRequestModel):
    """A function tool, flat as the Responses API writes it."""

    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ResponsesNamedToolChoice(OpenAIRequestModel):
    type: Literal["function"]
    name: str


class TextFormat(JsonSchemaFormat):
    """``text.format``: ``{"type": "text"}``, ``{"type": "json_object"}`` or
    ``{"type": "json_schema", "name", "schema", "strict"}``."""

    type: Literal["text", "json_object", "json_schema"] = "text"


class TextConfig(OpenAIRequestModel):
    format: TextFormat | None = None


class ResponsesRequest(OpenAIRequestModel):
    """``POST /v1/responses``.

    ``store`` (default True) keeps the response in the server's bounded
    in-memory store so that a later request may continue it with
    ``previous_response_id``.
    """

    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[ResponsesFunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | ResponsesNamedToolChoice | None = None
    parallel_tool_calls: bool | None = True
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stream: bool | None = False
    store: bool | None = True
    previous_response_id: str | None = None
    text: TextConfig | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    reasoning: dict[str, Any] | None = None
    truncation: Literal["auto", "disabled"] | None = "disabled"
    include: list[str] | None = Field(default=None)
    top_logprobs: int | None = None
    priority: int = 0
