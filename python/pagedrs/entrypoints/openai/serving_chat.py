"""``POST /v1/chat/completions``: the model's chat template, streamed or not."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from ...engine.protocol import EngineClient
from ...inputs import TokensPrompt
from ...outputs import CompletionOutput, RequestOutput
from ...sampling_params import SamplingParams
from .chat_options import ChatOptions
from .chat_reply import ChoiceReader
from .chat_tools import ToolPlan, plan_tools, template_message
from .errors import bad_request
from .protocol import (
    ChatChoiceLogprobs,
    ChatCompletionChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatResponseMessage,
    ChatStreamChoice,
    ChatTokenLogprob,
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    FunctionCall,
    ToolCallOut,
    TopLogprob,
)
from .serving_engine import (
    MAX_LOGPROBS,
    OpenAIServing,
    await_outputs,
    clamp_logprob,
    engine_error,
    top_entries,
)
from .structured_outputs import structured_outputs_of
from .tokenization import ServerTokenizer


def _chat_logprobs(c: CompletionOutput, start: int, end: int, k: int) -> ChatChoiceLogprobs:
    """Logprobs of tokens ``[start, end)`` of ``c`` with the ``k`` most likely tokens each."""
    content = []
    for tid, pos in zip(c.token_ids[start:end], (c.logprobs or [])[start:end], strict=False):
        chosen = pos.get(tid)
        token = (chosen.decoded_token if chosen else None) or ""
        content.append(
            ChatTokenLogprob(
                token=token,
                logprob=clamp_logprob(chosen.logprob) if chosen else -9999.0,
                bytes=list(token.encode()),
                top_logprobs=[
                    TopLogprob(
                        token=e.decoded_token or "",
                        logprob=clamp_logprob(e.logprob),
                        bytes=list((e.decoded_token or "").encode()),
                    )
                    for _, e in top_entries(pos, k)
                ],
            )
        )
    return ChatChoiceLogprobs(content=content)


class OpenAIServingChat(OpenAIServing):
    """Handler of ``/v1/chat/completions``; ``options``: the server's chat
    template and tool-call / reasoning parsers."""

    def __init__(
        self,
        engine: EngineClient,
        served_model_names: list[str],
        tokenizer: ServerTokenizer,
        options: ChatOptions | None = None,
    ) -> None:
        super().__init__(engine, served_model_names, tokenizer)
        self.options = options or ChatOptions()

    async def _render(self, req: ChatCompletionRequest, plan: ToolPlan) -> TokensPrompt:
        """The prompt (template applied) and its token ids, both made off the event
        loop.

        Raises:
            OpenAIError: 400 for unsupported content, a template error or a prompt
                too long to fit.
        """
        messages = []
        for i, m in enumerate(req.messages):
            if isinstance(m.content, list):
                texts = []
                for part in m.content:
                    if part.type != "text" or part.text is None:
                        raise bad_request(
                            f"messages[{i}]: only text content parts are supported, "
                            f"got type {part.type!r}",
                            "messages",
                        )
                    texts.append(part.text)
                content = "".join(texts)
            else:
                content = m.content or ""
            messages.append(template_message(m, content))
        if not self.tokenizer.chat_template:
            raise bad_request(
                "this model has no chat template (a GGUF file's 'tokenizer.chat_template' "
                "key, an HF tokenizer's 'chat_template'): use /v1/completions",
                "messages",
            )
        text, ids = await self.tokenizer.render_chat(
            messages,
            add_generation_prompt=req.add_generation_prompt is not False,
            tools=plan.template_tools,
            template_kwargs=req.chat_template_kwargs,
        )
        return TokensPrompt(prompt=text, prompt_token_ids=ids)

    async def prepare(
        self, req: ChatCompletionRequest
    ) -> tuple[TokensPrompt, SamplingParams, ToolPlan, int | None]:
        """Check ``req`` and build what the engine takes: the prompt (template
        applied, token ids), the sampling parameters, how the reply's tool
        calls are read, and the number of top logprobs (None: no logprobs).

        Raises:
            OpenAIError: invalid request (400), unknown model (404).
        """
        self.check_model(req.model)
        plan = plan_tools(req, self.options, self.tokenizer.chat_template)
        if req.top_logprobs is not None:
            if not req.logprobs:
                raise bad_request("top_logprobs requires logprobs to be true", "top_logprobs")
            if not 0 <= req.top_logprobs <= MAX_LOGPROBS:
                raise bad_request(f"top_logprobs must be in [0, {MAX_LOGPROBS}]", "top_logprobs")
        max_tokens = req.max_completion_tokens
        field = "max_completion_tokens"
        if max_tokens is None:
            max_tokens, field = req.max_tokens, "max_tokens"
        if max_tokens is not None and max_tokens < 1:
            raise bad_request(f"{field} must be >= 1, got {max_tokens}", field)
        structured = await structured_outputs_of(req)
        if plan.structured is not None and not (plan.mode == "auto" and structured is not None):
            # "auto"'s call constraint yields to the request's own structured outputs.
            if structured is not None:
                raise bad_request(
                    "tool_choice 'required' or a named function cannot be combined with "
                    "structured outputs",
                    "tool_choice",
                )
            structured = plan.structured
        reasoning = self.options.reasoning()
        if structured is not None and reasoning is not None:
            structured = reasoning.constrain_answer(structured)
        prompt = await self._render(req, plan)
        max_tokens = self.check_context_length(prompt["prompt_token_ids"], max_tokens, "messages")
        k = (req.top_logprobs or 0) if req.logprobs else None
        params = self.sampling_params(req, max_tokens, k, None, structured)
        return prompt, params, plan, k

    async def create(self, req: ChatCompletionRequest, raw: Request) -> Response:
        """Answer one request.

        Raises:
            OpenAIError: invalid request (400), unknown model (404), full queue
                (503), a failure in the model loop (500).
        """
        prompt, params, plan, k = await self.prepare(req)
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        lora = self.check_model(req.model)  # LoRA (pagedrs.lora): the adapter it names, or None
        outputs = await self.start([prompt], params, request_id, raw, req.priority, lora)
        created = int(time.time())
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return StreamingResponse(
                self._stream(req, request_id, created, outputs, k, include_usage, plan),
                media_type="text/event-stream",
            )
        final = await await_outputs(_final(outputs), raw)
        choices = []
        for c in final.outputs:
            reply = ChoiceReader(plan, self.options).whole(c.text)
            calls = [
                ToolCallOut(id=t.id, function=FunctionCall(name=t.name, arguments=t.arguments))
                for t in reply.tool_calls
            ]
            choices.append(
                ChatCompletionChoice(
                    index=c.index,
                    message=ChatResponseMessage(
                        content=reply.content,
                        reasoning_content=reply.reasoning,
                        tool_calls=calls,
                    ),
                    logprobs=None if k is None else _chat_logprobs(c, 0, len(c.token_ids), k),
                    finish_reason=_finish_reason(c.finish_reason, bool(calls)),
                    stop_reason=c.stop_reason,
                )
            )
        body = ChatCompletionResponse(
            id=request_id,
            created=created,
            model=req.model,
            choices=choices,
            usage=self.usage([final]),
        )
        return JSONResponse(body.model_dump())

    async def _stream(
        self,
        req: ChatCompletionRequest,
        request_id: str,
        created: int,
        outputs: AsyncGenerator[tuple[int, RequestOutput], None],
        k: int | None,
        include_usage: bool,
        plan: ToolPlan,
    ) -> AsyncIterator[str]:
        def sse(choices: list[ChatStreamChoice], usage: Any = None) -> str:
            chunk = ChatCompletionChunk(
                id=request_id, created=created, model=req.model, choices=choices, usage=usage
            )
            exclude = None if include_usage else {"usage"}
            return f"data: {chunk.model_dump_json(exclude=exclude)}\n\n"

        n = 1 if req.n is None else req.n
        yield sse(
            [ChatStreamChoice(index=i, delta=DeltaMessage(role="assistant", content=""))
             for i in range(n)]
        )  # fmt: skip
        sent_text = [0] * n
        sent_tokens = [0] * n
        done = [False] * n
        readers = [ChoiceReader(plan, self.options) for _ in range(n)]
        final: RequestOutput | None = None
        try:
            async for _, out in outputs:
                if out.finished:
                    final = out
                for c in out.outputs:
                    if done[c.index]:
                        continue
                    delta = c.text[sent_text[c.index] :]
                    finished = c.finish_reason is not None
                    lp = None
                    if k is not None:
                        lp = _chat_logprobs(c, sent_tokens[c.index], len(c.token_ids), k)
                    if not delta and not finished and not (lp and lp.content):
                        continue
                    sent_text[c.index], sent_tokens[c.index] = len(c.text), len(c.token_ids)
                    done[c.index] = finished
                    reader = readers[c.index]
                    piece = reader.feed(delta)
                    if finished:
                        piece = piece.then(reader.finish())
                    if piece.is_empty() and not finished and not (lp and lp.content):
                        continue
                    choice = ChatStreamChoice(
                        index=c.index,
                        delta=DeltaMessage(
                            content=piece.content or None,
                            reasoning_content=piece.reasoning or None,
                            tool_calls=[
                                DeltaToolCall(
                                    index=t.index,
                                    id=t.id,
                                    type="function" if t.id is not None else None,
                                    function=DeltaFunctionCall(name=t.name, arguments=t.arguments),
                                )
                                for t in piece.tool_calls
                            ]
                            or None,
                        ),
                        logprobs=lp,
                        finish_reason=_finish_reason(c.finish_reason, reader.called),
                    )
                    yield sse([choice])
            if include_usage and final is not None:
                yield sse([], self.usage([final]))
        except Exception as exc:
            yield engine_error(exc).sse()
        finally:
            await outputs.aclose()
        yield "data: [DONE]\n\n"


def _finish_reason(reason: str | None, called: bool) -> str | None:
    """OpenAI's ``"tool_calls"`` for a reply that ended on its own with calls."""
    return "tool_calls" if called and reason == "stop" else reason


async def _final(outputs: AsyncIterator[tuple[int, RequestOutput]]) -> RequestOutput:
    final = None
    async for _, out in outputs:
        final = out
    assert final is not None and final.finished
    return final
