"""Pydantic models of the OpenAI API: requests (strictly typed), responses, errors.

Requests are validated in strict mode: a string where a number belongs, a float
where an integer belongs, or a number where a boolean belongs is an error
(HTTP 400), not a silent conversion. Unknown fields are ignored, as OpenAI does.
Optional fields accept ``null`` and then take their default.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# ---------------------------------------------------------------------------
# Requests


class OpenAIRequestModel(BaseModel):
    """Base of request models: strict types, unknown fields ignored."""

    model_config = ConfigDict(strict=True, extra="ignore")


class StreamOptions(OpenAIRequestModel):
    """``stream_options``: ``include_usage`` adds a last chunk with the usage counts."""

    include_usage: bool | None = False


class JsonSchemaFormat(OpenAIRequestModel):
    """``response_format.json_schema``: the schema the reply follows.

    ``strict`` is accepted; the schema is always enforced (properties the
    schema does not name are never generated).
    """

    model_config = ConfigDict(strict=True, extra="ignore", populate_by_name=True)

    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(OpenAIRequestModel):
    """``response_format`` (OpenAI's): ``{"type": "text"}``, ``{"type":
    "json_object"}``, or ``{"type": "json_schema", "json_schema": {"name",
    "schema", "strict"}}``."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class SamplingRequest(OpenAIRequestModel):
    """Fields common to completions and chat completions.

    OpenAI's fields, then vLLM's extensions (``top_k``, ``min_p``,
    ``repetition_penalty``, ``min_tokens``, ``ignore_eos``, ``stop_token_ids``,
    ``skip_special_tokens``, ``include_stop_str_in_output``, ``priority``:
    lower runs first under ``--scheduling-policy priority``), passed by the
    ``openai`` client through ``extra_body``.

    Structured outputs: OpenAI's ``response_format``, or vLLM's
    ``structured_outputs`` object (the fields of ``StructuredOutputsParams``)
    or its ``guided_json``, ``guided_regex``, ``guided_choice``,
    ``guided_grammar`` (and ``guided_whitespace_pattern``); at most one.
    """

    model: str
    n: int | None = 1
    temperature: float | None = None
    top_p: float | None = None
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = 0.0
    frequency_penalty: float | None = 0.0
    seed: int | None = None
    user: str | None = None
    logit_bias: dict[str, float] | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = 0
    ignore_eos: bool | None = False
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool | None = True
    include_stop_str_in_output: bool | None = False
    priority: int = 0
    response_format: ResponseFormat | None = None
    structured_outputs: dict[str, Any] | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_whitespace_pattern: str | None = None


class CompletionRequest(SamplingRequest):
    """``POST /v1/completions``.

    ``prompt`` is a string, a list of strings, a list of token ids, or a list of
    lists of token ids (one request per prompt; choices are numbered
    ``prompt_index * n + i``). ``logprobs`` (0-20) returns that many top tokens
    per position. ``use_beam_search`` (vLLM's extension) runs a beam search of
    ``n`` beams per prompt (``length_penalty``, ``early_stopping``: as
    ``BeamSearchParams``); its choices are the finished beams, best first.
    """

    # Left to right, token ids before strings: a list of ids is accepted as such at
    # once, where the default ("smart") union also validates it as list[str], item by
    # item, seconds for a few million ids.
    prompt: Annotated[
        str | list[int] | list[list[int]] | list[str], Field(union_mode="left_to_right")
    ]
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: bool | None = False
    best_of: int | None = None
    suffix: str | None = None
    use_beam_search: bool = False
    length_penalty: float = 1.0
    early_stopping: bool | Literal["never"] = False


class TextContentPart(OpenAIRequestModel):
    """One part of a message's content; only ``type: "text"`` is supported."""

    type: str
    text: str | None = None


class ToolCallFunction(OpenAIRequestModel):
    """A call's function: its name and its arguments as JSON object text."""

    name: str
    arguments: str


class ToolCallParam(OpenAIRequestModel):
    """A tool call of an assistant message in the history."""

    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


class FunctionDefinition(OpenAIRequestModel):
    """A function the model may call: ``parameters`` is its arguments' JSON Schema."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatTool(OpenAIRequestModel):
    """One entry of ``tools``."""

    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(OpenAIRequestModel):
    name: str


class NamedToolChoice(OpenAIRequestModel):
    """``tool_choice`` naming the function the reply must call."""

    type: Literal["function"]
    function: NamedFunction


class ChatMessage(OpenAIRequestModel):
    """One message of a conversation: an assistant message may carry
    ``tool_calls`` (then ``content`` may be left out), a ``tool`` message
    answers the call ``tool_call_id``."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallParam] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None

    @model_validator(mode="after")
    def _content_required(self) -> ChatMessage:
        """As OpenAI: only an assistant message may leave ``content`` out; a
        ``tool`` message names the call it answers."""
        if self.content is None and self.role != "assistant":
            raise ValueError(f"content is required for a {self.role!r} message")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("tool_call_id is required for a 'tool' message")
        return self


class ChatCompletionRequest(SamplingRequest):
    """``POST /v1/chat/completions``.

    ``tools`` (functions with JSON Schema parameters) and ``tool_choice``
    (``"none"``, ``"auto"``: the server's ``--tool-call-parser`` reads calls out
    of the reply, ``"required"`` or a named function: the reply is constrained
    to calls whose arguments match the schema), ``parallel_tool_calls``;
    ``chat_template_kwargs`` are passed to the chat template (vLLM's).

    ``max_completion_tokens`` wins over ``max_tokens``; without either the
    reply may fill the context. ``logprobs`` (bool) returns the sampled tokens'
    log-probabilities, with ``top_logprobs`` (0-20) most likely tokens each.
    """

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = None
    tools: list[ChatTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = True
    add_generation_prompt: bool | None = True
    chat_template_kwargs: dict[str, Any] | None = None


class TokenizeCompletionRequest(OpenAIRequestModel):
    """``POST /tokenize`` of a prompt (vLLM's body)."""

    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool | None = False


class TokenizeChatRequest(OpenAIRequestModel):
    """``POST /tokenize`` of a conversation through the chat template (vLLM's body)."""

    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    add_generation_prompt: bool = True
    tools: list[ChatTool] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: bool | None = False


class DetokenizeRequest(OpenAIRequestModel):
    """``POST /detokenize`` (vLLM's body)."""

    model: str | None = None
    tokens: list[int]


# ---------------------------------------------------------------------------
# Responses


def _now() -> int:
    return int(time.time())


class PromptTokenUsageInfo(BaseModel):
    """``usage.prompt_tokens_details``: ``cached_tokens``, the prompt tokens
    found in the prefix cache (not prefilled again)."""

    cached_tokens: int | None = None


class UsageInfo(BaseModel):
    """Token counts of one response."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokenUsageInfo | None = None


class CompletionLogprobs(BaseModel):
    """Logprobs of a completion choice, per generated token."""

    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatChoiceLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None = None


class FunctionCall(BaseModel):
    name: str
    arguments: str


class ToolCallOut(BaseModel):
    """A tool call of a reply (``arguments``: JSON object text)."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatResponseMessage(BaseModel):
    role: str = "assistant"
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallOut] = Field(default_factory=list)


class DeltaFunctionCall(BaseModel):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(BaseModel):
    """A streamed piece of call ``index``: ``id``, ``type`` and the name come
    first, then the arguments in pieces."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunctionCall


class ChatCompletionChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: ChatChoiceLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[ChatCompletionChoice]
    usage: UsageInfo


class DeltaMessage(BaseModel):
    role: str | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChatStreamChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatChoiceLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[ChatStreamChoice]
    usage: UsageInfo | None = None


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeResponse(BaseModel):
    prompt: str


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=_now)
    owned_by: str = "pagedrs"
    root: str | None = None
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorInfo(BaseModel):
    """OpenAI's error object."""

    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """OpenAI's error body: ``{"error": {"message", "type", "param", "code"}}``."""

    error: ErrorInfo
