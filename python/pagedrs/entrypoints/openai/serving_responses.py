"""``POST /v1/responses`` (OpenAI's Responses API) over the chat path.

A request becomes a chat completion (``protocol_responses`` for the input
items): the history of ``previous_response_id``, then ``instructions`` as a
system message, then the input items. The reply is read as a chat choice
(reasoning, answer, tool calls: ``chat_reply.ChoiceReader``) and returned as
output items (``reasoning``, ``message`` with ``output_text``,
``function_call``), whole or as the API's streaming events
(``response.created``, ``response.output_item.added``,
``response.output_text.delta``, ``response.function_call_arguments.delta``,
..., ``response.completed``), each with its ``sequence_number``.

Responses with ``store`` (the default) are kept in memory, the most recent
``STORE_SIZE``, so that ``previous_response_id`` can continue them and
``GET /v1/responses/{id}`` return them; an id not kept is a 400.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from ...outputs import RequestOutput
from .chat_reply import ChoiceReader
from .chat_tools import ToolPlan
from .errors import OpenAIError, bad_request
from .protocol import ChatCompletionRequest
from .protocol_responses import ResponsesRequest
from .responses_events import EventWriter, call_item, message_item, reasoning_item
from .serving_chat import OpenAIServingChat, _final
from .serving_engine import await_outputs, engine_error

STORE_SIZE = 1024


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _text_of(content: Any, where: str) -> str:
    """A message's or output's text: a string, or its text parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or not isinstance(part.get("text"), str):
                raise bad_request(f"{where}.content[{j}]: only text parts are supported", "input")
            if part.get("type") not in ("input_text", "output_text", "text"):
                raise bad_request(
                    f"{where}.content[{j}]: type {part.get('type')!r} is not supported "
                    "(input_text, output_text)",
                    "input",
                )
            texts.append(part["text"])
        return "".join(texts)
    raise bad_request(f"{where}.content must be a string or a list of text parts", "input")


def input_messages(items: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages of a request's ``input``.

    Raises:
        OpenAIError: 400 naming ``input`` for an item it cannot take.
    """
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        where = f"input[{i}]"
        kind = item.get("type", "message")
        if kind == "message" or (kind is None and "role" in item):
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise bad_request(f"{where}.role {role!r} is not supported", "input")
            messages.append(
                {
                    "role": "system" if role == "developer" else role,
                    "content": _text_of(item.get("content"), where),
                }
            )
        elif kind == "function_call":
            for key in ("call_id", "name", "arguments"):
                if not isinstance(item.get(key), str):
                    raise bad_request(f"{where}.{key} must be a string", "input")
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise bad_request(f"{where}.call_id must be a string", "input")
            output = item.get("output")
            text = output if isinstance(output, str) else _text_of(output, where)
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": text})
        elif kind == "reasoning":
            continue
        else:
            raise bad_request(f"{where}.type {kind!r} is not supported", "input")
    return messages


class ResponseStore:
    """The last ``size`` stored responses: each one's conversation (input
    history and its output as messages) and its response object."""

    def __init__(self, size: int = STORE_SIZE) -> None:
        self.size = size
        self._items: OrderedDict[str, tuple[list[dict[str, Any]], dict[str, Any]]] = OrderedDict()

    def put(self, rid: str, messages: list[dict[str, Any]], response: dict[str, Any]) -> None:
        self._items[rid] = (messages, response)
        self._items.move_to_end(rid)
        while len(self._items) > self.size:
            self._items.popitem(last=False)

    def get(self, rid: str) -> tuple[list[dict[str, Any]], dict[str, Any]] | None:
        return self._items.get(rid)


def _output_messages(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A response's output items as the assistant message the history keeps."""
    content = "".join(
        part["text"] for item in items if item["type"] == "message" for part in item["content"]
    )
    calls = [
        {
            "id": item["call_id"],
            "type": "function",
            "function": {"name": item["name"], "arguments": item["arguments"]},
        }
        for item in items
        if item["type"] == "function_call"
    ]
    message: dict[str, Any] = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = calls
    return [message] if content or calls else []


class OpenAIServingResponses:
    """Handler of ``/v1/responses``, on the chat handler ``chat``."""

    def __init__(self, chat: OpenAIServingChat, store: ResponseStore | None = None) -> None:
        self.chat = chat
        self.store = store or ResponseStore()

    def _chat_request(self, req: ResponsesRequest) -> tuple[ChatCompletionRequest, list[Any]]:
        """The chat request of ``req`` and the history to store (without
        ``instructions``, which a continuation does not inherit)."""
        history: list[dict[str, Any]] = []
        if req.previous_response_id is not None:
            stored = self.store.get(req.previous_response_id)
            if stored is None:
                raise bad_request(
                    f"previous_response_id {req.previous_response_id!r} is not a stored "
                    f"response (this server keeps the last {self.store.size} in memory)",
                    "previous_response_id",
                )
            history = list(stored[0])
        history += input_messages(req.input)
        messages = list(history)
        if req.instructions:
            messages.insert(0, {"role": "system", "content": req.instructions})
        if not messages:
            raise bad_request("input holds no message", "input")
        tools = []
        for i, tool in enumerate(req.tools or []):
            if tool.type != "function" or not tool.name:
                raise bad_request(
                    f"tools[{i}]: only function tools with a name are supported, got type "
                    f"{tool.type!r}",
                    "tools",
                )
            function: dict[str, Any] = {"name": tool.name, "description": tool.description}
            if tool.parameters is not None:
                function["parameters"] = tool.parameters
            tools.append({"type": "function", "function": function})
        choice: Any = req.tool_choice
        if req.tool_choice is not None and not isinstance(req.tool_choice, str):
            choice = {"type": "function", "function": {"name": req.tool_choice.name}}
        body: dict[str, Any] = {
            "model": req.model,
            "messages": messages,
            "tools": tools or None,
            "tool_choice": choice,
            "parallel_tool_calls": req.parallel_tool_calls,
            "max_completion_tokens": req.max_output_tokens,
            "temperature": req.temperature,
            "top_p": req.top_p,
            "seed": req.seed,
            "priority": req.priority,
        }
        fmt = req.text.format if req.text is not None else None
        if fmt is not None and fmt.type != "text":
            body["response_format"] = {"type": fmt.type}
            if fmt.type == "json_schema":
                body["response_format"]["json_schema"] = {
                    "name": fmt.name,
                    "schema": fmt.schema_,
                    "strict": fmt.strict,
                }
        try:
            return ChatCompletionRequest.model_validate(body), history
        except ValidationError as exc:
            first = exc.errors()[0]
            loc = ".".join(str(p) for p in first.get("loc", ()))
            raise bad_request(f"{loc}: {first.get('msg')}", "input") from None

    def _response(
        self,
        req: ResponsesRequest,
        rid: str,
        created: int,
        status: str,
        output: list[dict[str, Any]],
        final: RequestOutput | None,
    ) -> dict[str, Any]:
        """The response object (OpenAI's fields)."""
        usage = None
        if final is not None:
            n_in = len(final.prompt_token_ids)
            n_out = sum(len(c.token_ids) for c in final.outputs)
            usage = {
                "input_tokens": n_in,
                "input_tokens_details": {"cached_tokens": final.num_cached_tokens or 0},
                "output_tokens": n_out,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": n_in + n_out,
            }
        incomplete = None
        if final is not None and final.outputs and final.outputs[0].finish_reason == "length":
            status, incomplete = "incomplete", {"reason": "max_output_tokens"}
        tool_choice: Any = req.tool_choice if req.tool_choice is not None else "auto"
        if not isinstance(tool_choice, str):
            tool_choice = tool_choice.model_dump()
        return {
            "id": rid,
            "object": "response",
            "created_at": created,
            "status": status,
            "error": None,
            "incomplete_details": incomplete,
            "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "model": req.model,
            "output": output,
            "parallel_tool_calls": req.parallel_tool_calls is not False,
            "previous_response_id": req.previous_response_id,
            "reasoning": req.reasoning,
            "store": req.store is not False,
            "temperature": 1.0 if req.temperature is None else req.temperature,
            "text": {"format": {"type": "text"}}
            if req.text is None
            else req.text.model_dump(by_alias=True, exclude_none=True),
            "tool_choice": tool_choice,
            "tools": [t.model_dump(exclude_none=True) for t in req.tools or []],
            "top_p": 1.0 if req.top_p is None else req.top_p,
            "truncation": req.truncation or "disabled",
            "usage": usage,
            "user": req.user,
            "metadata": req.metadata or {},
        }

    async def create(self, req: ResponsesRequest, raw: Request) -> Response:
        """Answer one request.

        Raises:
            OpenAIError: invalid request (400), unknown model (404), full queue
                (503), a failure in the model loop (500).
        """
        chat_req, history = self._chat_request(req)
        prompt, params, plan, _ = await self.chat.prepare(chat_req)
        if params.n != 1:
            raise bad_request("the Responses API returns one output", "input")
        rid = _id("resp")
        lora = self.chat.check_model(chat_req.model)  # LoRA (pagedrs.lora): adapter or None
        outputs = await self.chat.start([prompt], params, rid, raw, req.priority, lora)
        created = int(time.time())
        if req.stream:
            return StreamingResponse(
                self._events(req, rid, created, outputs, plan, history),
                media_type="text/event-stream",
            )
        final = await await_outputs(_final(outputs), raw)
        reply = ChoiceReader(plan, self.chat.options).whole(final.outputs[0].text)
        output: list[dict[str, Any]] = []
        if reply.reasoning:
            output.append(reasoning_item(_id("rs"), reply.reasoning))
        if reply.content:
            output.append(message_item(_id("msg"), reply.content, "completed"))
        for call in reply.tool_calls:
            output.append(call_item(_id("fc"), call.id, call.name, call.arguments, "completed"))
        response = self._response(req, rid, created, "completed", output, final)
        if req.store is not False:
            self.store.put(rid, history + _output_messages(output), response)
        return JSONResponse(response)

    def retrieve(self, rid: str) -> dict[str, Any]:
        """A stored response.

        Raises:
            OpenAIError: 404 when ``rid`` is not kept.
        """
        stored = self.store.get(rid)
        if stored is None:
            raise OpenAIError(404, f"response {rid!r} is not stored here", param="response_id")
        return stored[1]

    async def _events(
        self,
        req: ResponsesRequest,
        rid: str,
        created: int,
        outputs: AsyncGenerator[tuple[int, RequestOutput], None],
        plan: ToolPlan,
        history: list[dict[str, Any]],
    ) -> AsyncIterator[str]:
        events = EventWriter()
        yield events.emit(
            "response.created",
            response=self._response(req, rid, created, "in_progress", [], None),
        )
        yield events.emit(
            "response.in_progress",
            response=self._response(req, rid, created, "in_progress", [], None),
        )
        reader = ChoiceReader(plan, self.chat.options)
        sent = 0
        final: RequestOutput | None = None
        try:
            async for _, out in outputs:
                c = out.outputs[0]
                piece = reader.feed(c.text[sent:])
                sent = len(c.text)
                if out.finished:
                    final = out
                    piece = piece.then(reader.finish())
                for event in events.piece(piece):
                    yield event
            for event in events.close():
                yield event
            response = self._response(req, rid, created, "completed", events.output, final)
            if req.store is not False:
                self.store.put(rid, history + _output_messages(events.output), response)
            yield events.emit("response.completed", response=response)
        except Exception as exc:
            error = engine_error(exc)
            yield events.emit("error", code=error.code, message=error.message, param=None)
        finally:
            await outputs.aclose()
