"""``POST /v1/chat/completions``: the model's chat template, streamed or not."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from ...outputs import CompletionOutput, RequestOutput
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
    DeltaMessage,
    TopLogprob,
)
from .serving_engine import MAX_LOGPROBS, OpenAIServing, clamp_logprob, engine_error, top_entries
from .streams import ClientDisconnected, until_disconnected
from .structured_outputs import structured_outputs_of


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
    """Handler of ``/v1/chat/completions``."""

    async def _render(self, req: ChatCompletionRequest) -> dict[str, Any]:
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
            msg = {"role": m.role, "content": content}
            if m.name is not None:
                msg["name"] = m.name
            messages.append(msg)
        if not self.tokenizer.chat_template:
            raise bad_request("this model has no chat template: use /v1/completions", "messages")
        text, ids = await self.tokenizer.render_chat(
            messages, add_generation_prompt=req.add_generation_prompt is not False
        )
        return {"prompt": text, "prompt_token_ids": ids}

    async def create(self, req: ChatCompletionRequest, raw: Request) -> Response:
        """Answer one request.

        Raises:
            OpenAIError: invalid request (400), unknown model (404), full queue
                (503), a failure in the model loop (500).
        """
        self.check_model(req.model)
        if req.tools:
            raise bad_request("tools are not supported", "tools")
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
        prompt = await self._render(req)
        max_tokens = self.check_prompt(prompt["prompt_token_ids"], max_tokens, "messages")
        k = (req.top_logprobs or 0) if req.logprobs else None
        params = self.sampling_params(req, max_tokens, k, None, structured)
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        outputs = await self.start([prompt], params, request_id, raw, req.priority)
        created = int(time.time())
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return StreamingResponse(
                self._stream(req, request_id, created, outputs, k, include_usage),
                media_type="text/event-stream",
            )
        try:
            final = await until_disconnected(_final(outputs), raw)
        except ClientDisconnected:
            return Response(status_code=499)
        except Exception as exc:
            raise engine_error(exc) from None
        choices = [
            ChatCompletionChoice(
                index=c.index,
                message=ChatResponseMessage(content=c.text),
                logprobs=None if k is None else _chat_logprobs(c, 0, len(c.token_ids), k),
                finish_reason=c.finish_reason,
                stop_reason=c.stop_reason,
            )
            for c in final.outputs
        ]
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
                    choice = ChatStreamChoice(
                        index=c.index,
                        delta=DeltaMessage(content=delta) if delta else DeltaMessage(),
                        logprobs=lp,
                        finish_reason=c.finish_reason,
                    )
                    yield sse([choice])
            if include_usage and final is not None:
                yield sse([], self.usage([final]))
        except Exception as exc:
            yield engine_error(exc).sse()
        finally:
            await outputs.aclose()
        yield "data: [DONE]\n\n"


async def _final(outputs: AsyncIterator[tuple[int, RequestOutput]]) -> RequestOutput:
    final = None
    async for _, out in outputs:
        final = out
    assert final is not None and final.finished
    return final
