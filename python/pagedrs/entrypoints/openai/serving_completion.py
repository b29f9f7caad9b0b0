"""``POST /v1/completions``: text completion, streamed (server-sent events) or not."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from ...inputs import TokensPrompt
from ...outputs import CompletionOutput, RequestOutput
from ...sampling_params import BeamSearchParams, SamplingParams, StructuredOutputsParams
from .errors import bad_request, invalid_request
from .protocol import (
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
)
from .serving_engine import MAX_LOGPROBS, OpenAIServing, await_outputs, clamp_logprob, engine_error
from .structured_outputs import structured_outputs_of


def _logprobs(
    c: CompletionOutput, start: int, end: int, offset: int
) -> tuple[CompletionLogprobs, int]:
    """Logprobs of tokens ``[start, end)`` of ``c``, text offsets from ``offset``.

    Returns:
        the logprobs and the offset after the last token.
    """
    lp = CompletionLogprobs()
    for tid, pos in zip(c.token_ids[start:end], (c.logprobs or [])[start:end], strict=False):
        chosen = pos.get(tid)
        token = (chosen.decoded_token if chosen else None) or ""
        lp.tokens.append(token)
        lp.token_logprobs.append(clamp_logprob(chosen.logprob) if chosen else None)
        lp.top_logprobs.append(
            {(e.decoded_token or ""): clamp_logprob(e.logprob) for e in pos.values()}
        )
        lp.text_offset.append(offset)
        offset += len(token)
    return lp, offset


class OpenAIServingCompletion(OpenAIServing):
    """Handler of ``/v1/completions``."""

    async def _prompts(self, req: CompletionRequest) -> list[TokensPrompt]:
        """The prompts with their token ids; every text is checked against the
        context by its length in characters before any is tokenized.

        Raises:
            OpenAIError: 400 for an empty prompt list, more prompts than the waiting
                queue holds, or a text too long to fit.
        """
        p = req.prompt
        if isinstance(p, str):
            items: list[str | list[int]] = [p]
        elif p and isinstance(p[0], int):  # validated: a list of one type
            items = [p]
        else:
            items = list(p)  # type: ignore[arg-type]
        if not items:
            raise bad_request("prompt is empty", "prompt")
        if len(items) > self.engine.max_waiting_requests:
            raise bad_request(
                f"at most {self.engine.max_waiting_requests} prompts fit in the waiting "
                f"queue (max_waiting_requests), got {len(items)}",
                "prompt",
            )
        for item in items:
            if isinstance(item, str):
                self.tokenizer.check_chars(item, "prompt")
        out: list[TokensPrompt] = []
        for item in items:
            if isinstance(item, str):
                ids = await self.tokenizer.encode(item)
                out.append(TokensPrompt(prompt=item, prompt_token_ids=ids))
            else:
                out.append(TokensPrompt(prompt_token_ids=list(item)))
        return out

    async def create(self, req: CompletionRequest, raw: Request) -> Response:
        """Answer one request.

        Raises:
            OpenAIError: invalid request (400), unknown model (404), full queue
                (503), a failure in the model loop (500).
        """
        lora = self.check_model(req.model)
        if req.suffix:
            raise bad_request("suffix is not supported", "suffix")
        if req.logprobs is not None and not 0 <= req.logprobs <= MAX_LOGPROBS:
            raise bad_request(f"logprobs must be in [0, {MAX_LOGPROBS}]", "logprobs")
        n = 1 if req.n is None else req.n
        if req.stream and req.best_of is not None and req.best_of > n:
            raise bad_request("best_of > n cannot be streamed", "best_of")
        if req.max_tokens is not None and req.max_tokens < 1:
            raise bad_request(f"max_tokens must be >= 1, got {req.max_tokens}", "max_tokens")
        structured = await structured_outputs_of(req)
        prompts = await self._prompts(req)
        max_tokens = min(
            self.check_context_length(p["prompt_token_ids"], req.max_tokens, "prompt")
            for p in prompts
        )
        params: SamplingParams | BeamSearchParams
        if req.use_beam_search:
            params = _beam_search_params(req, n, max_tokens, structured)
        else:
            params = self.sampling_params(req, max_tokens, req.logprobs, req.best_of, structured)
        if req.echo:
            for p in prompts:
                if "prompt" not in p:
                    p["prompt"] = await self.tokenizer.decode(p["prompt_token_ids"])
        request_id = f"cmpl-{uuid.uuid4().hex}"
        outputs = await self.start(prompts, params, request_id, raw, req.priority, lora)
        created = int(time.time())
        echo = [p.get("prompt", "") if req.echo else "" for p in prompts]
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return StreamingResponse(
                self._stream(req, request_id, created, outputs, echo, n, include_usage),
                media_type="text/event-stream",
            )
        finals = await await_outputs(_finals(outputs, len(prompts)), raw)
        choices = []
        for i, final in enumerate(finals):
            for c in final.outputs:
                text = echo[i] + c.text
                lp = None
                if req.logprobs is not None:
                    lp, _ = _logprobs(c, 0, len(c.token_ids), len(echo[i]))
                choices.append(
                    CompletionChoice(
                        index=i * n + c.index,
                        text=text,
                        logprobs=lp,
                        finish_reason=c.finish_reason,
                        stop_reason=c.stop_reason,
                    )
                )
        body = CompletionResponse(
            id=request_id,
            created=created,
            model=req.model,
            choices=choices,
            usage=self.usage(finals),
        )
        return JSONResponse(body.model_dump())

    async def _stream(
        self,
        req: CompletionRequest,
        request_id: str,
        created: int,
        outputs: AsyncGenerator[tuple[int, RequestOutput], None],
        echo: list[str],
        n: int,
        include_usage: bool,
    ) -> AsyncIterator[str]:
        sent_text: dict[int, int] = {}
        sent_tokens: dict[int, int] = {}
        offsets: dict[int, int] = {}
        done: set[int] = set()
        finals: dict[int, RequestOutput] = {}
        try:
            async for i, out in outputs:
                if out.finished:
                    finals[i] = out
                for c in out.outputs:
                    idx = i * n + c.index
                    if idx in done:
                        continue
                    first = idx not in sent_text
                    prev_text, prev_tok = sent_text.get(idx, 0), sent_tokens.get(idx, 0)
                    delta = (echo[i] if first else "") + c.text[prev_text:]
                    finished = c.finish_reason is not None
                    lp = None
                    if req.logprobs is not None:
                        start = offsets.get(idx, len(echo[i]))
                        lp, offsets[idx] = _logprobs(c, prev_tok, len(c.token_ids), start)
                    if not delta and not finished and not (lp and lp.tokens):
                        continue
                    sent_text[idx], sent_tokens[idx] = len(c.text), len(c.token_ids)
                    if finished:
                        done.add(idx)
                    choice = CompletionChoice(
                        index=idx,
                        text=delta,
                        logprobs=lp,
                        finish_reason=c.finish_reason,
                        stop_reason=c.stop_reason,
                    )
                    chunk = CompletionResponse(
                        id=request_id, created=created, model=req.model, choices=[choice]
                    )
                    yield _sse(chunk, include_usage)
            if include_usage:
                usage = self.usage(list(finals.values()))
                chunk = CompletionResponse(
                    id=request_id, created=created, model=req.model, choices=[], usage=usage
                )
                yield f"data: {chunk.model_dump_json()}\n\n"
        except Exception as exc:
            yield engine_error(exc).sse()
        finally:
            await outputs.aclose()
        yield "data: [DONE]\n\n"


def _beam_search_params(
    req: CompletionRequest, n: int, max_tokens: int, structured: StructuredOutputsParams | None
) -> BeamSearchParams:
    """The beam search a ``use_beam_search`` request asks for: ``n`` beams.

    Raises:
        OpenAIError: 400 naming a field beam search does not take (streaming,
            ``best_of``, ``logprobs``, structured outputs) or an invalid one.
    """
    refused = {
        "stream": bool(req.stream),
        "best_of": req.best_of is not None and req.best_of != n,
        "logprobs": req.logprobs is not None,
        "structured_outputs": structured is not None,
    }
    for name, given in refused.items():
        if given:
            raise bad_request(f"{name} is not supported with use_beam_search", name)
    try:
        return BeamSearchParams(
            beam_width=n,
            max_tokens=max_tokens,
            ignore_eos=bool(req.ignore_eos),
            length_penalty=req.length_penalty,
            early_stopping=req.early_stopping,
        )
    except ValueError as exc:
        raise invalid_request(exc) from None


def _sse(chunk: CompletionResponse, include_usage: bool) -> str:
    exclude = None if include_usage else {"usage"}
    return f"data: {chunk.model_dump_json(exclude=exclude)}\n\n"


async def _finals(outputs: AsyncIterator[tuple[int, RequestOutput]], count: int) -> list[Any]:
    finals: list[RequestOutput | None] = [None] * count
    async for i, out in outputs:
        if out.finished:
            finals[i] = out
    return finals
