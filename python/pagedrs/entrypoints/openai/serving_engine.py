"""What completions and chat completions share: model check, sampling parameters,
the context-length check, starting engine requests, logprob values. Tokenizing happens on the
worker threads of :class:`~.tokenization.ServerTokenizer`, never on the event loop."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncGenerator, Awaitable, Sequence
from typing import Any, TypeVar

from starlette.requests import Request

from ...engine.async_base import EngineDeadError, QueueFullError, RequestFailedError
from ...engine.protocol import EngineClient
from ...engine.validation import InvalidRequestError, check_context_length
from ...inputs import TokensPrompt
from ...lora.request import LoRARequest
from ...outputs import Logprob, PositionLogprobs, RequestOutput
from ...sampling_params import BeamSearchParams, SamplingParams, StructuredOutputsParams
from .errors import OpenAIError, bad_request, invalid_request
from .protocol import PromptTokenUsageInfo, SamplingRequest, UsageInfo
from .serving_lora import LoRAModules
from .streams import ClientDisconnected, merge, prepend, until_disconnected
from .tokenization import ServerTokenizer

MAX_LOGPROBS = 20
MAX_N = 128
# JSON has no -inf: the smallest logprob reported.
MIN_LOGPROB = -9999.0

T = TypeVar("T")


def engine_error(exc: BaseException) -> OpenAIError:
    """The HTTP error for an exception of ``EngineClient.generate``."""
    if isinstance(exc, QueueFullError):
        return OpenAIError(503, str(exc), code="queue_full")
    if isinstance(exc, EngineDeadError):
        return OpenAIError(503, str(exc), code="engine_dead")
    if isinstance(exc, ValueError):
        return invalid_request(exc)
    if isinstance(exc, RequestFailedError):
        return OpenAIError(500, str(exc), type="server_error", code="request_failed")
    return OpenAIError(500, f"internal error: {type(exc).__name__}: {exc}", type="server_error")


async def await_outputs(aw: Awaitable[T], raw: Request) -> T:
    """Await a non-streamed response's outputs ``aw`` while the client stays.

    Raises:
        ClientDisconnected: the client left (the app answers 499).
        OpenAIError: the engine failed (``engine_error``).
    """
    try:
        return await until_disconnected(aw, raw)
    except ClientDisconnected:
        raise
    except Exception as exc:
        raise engine_error(exc) from None


def clamp_logprob(lp: float) -> float:
    """A JSON-safe logprob (no -inf or NaN)."""
    return lp if math.isfinite(lp) and lp > MIN_LOGPROB else MIN_LOGPROB


def top_entries(position: PositionLogprobs, k: int) -> list[tuple[int, Logprob]]:
    """The ``k`` most likely tokens of a position, by rank."""
    ranked = sorted(position.items(), key=lambda kv: kv[1].rank)
    return [kv for kv in ranked if kv[1].rank <= k][:k]


class OpenAIServing:
    """Base of the endpoint handlers.

    Args:
        engine: the running engine.
        served_model_names: names accepted in ``model`` (the first is reported).
        tokenizer: the tokenizer threads to use (default: new ones over a copy of
            the engine's tokenizer; share one between handlers).
    """

    def __init__(
        self,
        engine: EngineClient,
        served_model_names: list[str],
        tokenizer: ServerTokenizer | None = None,
    ) -> None:
        self.engine = engine
        self.served_model_names = served_model_names
        self.tokenizer = tokenizer or ServerTokenizer(engine.tokenizer, engine.max_model_len)
        self.lora_modules: LoRAModules | None = None  # LoRA (pagedrs.lora): set by build_app

    def check_model(self, model: str) -> LoRARequest | None:
        """The LoRA adapter ``model`` names (None: the base model).

        Raises:
            OpenAIError: 404 when ``model`` is not served."""
        if model in self.served_model_names:
            return None
        lora = self.lora_modules.request_of(model) if self.lora_modules is not None else None
        if lora is None:
            served = self.served_model_names + (
                self.lora_modules.names() if self.lora_modules is not None else []
            )
            raise OpenAIError(
                404,
                f"The model `{model}` does not exist. Served: {', '.join(served)}",
                param="model",
                code="model_not_found",
            )
        return lora

    def sampling_params(
        self,
        req: SamplingRequest,
        max_tokens: int,
        logprobs: int | None,
        best_of: int | None,
        structured_outputs: StructuredOutputsParams | None = None,
    ) -> SamplingParams:
        """Build the engine's parameters from the request's fields (and its
        structured outputs, from ``structured_outputs.structured_outputs_of``).

        Raises:
            OpenAIError: 400 naming the invalid field.
        """
        n = 1 if req.n is None else req.n
        for name, v in (("n", n), ("best_of", best_of)):
            if v is not None and v > MAX_N:
                raise bad_request(f"{name} must be at most {MAX_N}, got {v}", param=name)
        if req.logit_bias:
            raise bad_request("logit_bias is not supported", param="logit_bias")
        try:
            self.engine.check_priority(req.priority)
        except ValueError as exc:
            raise invalid_request(exc) from None
        if req.stream_options is not None and not req.stream:
            raise bad_request(
                "stream_options is only allowed when stream is true", param="stream_options"
            )
        try:
            return SamplingParams(
                n=n,
                best_of=best_of,
                temperature=1.0 if req.temperature is None else req.temperature,
                top_p=1.0 if req.top_p is None else req.top_p,
                top_k=0 if req.top_k is None else req.top_k,
                min_p=0.0 if req.min_p is None else req.min_p,
                presence_penalty=req.presence_penalty or 0.0,
                frequency_penalty=req.frequency_penalty or 0.0,
                repetition_penalty=(
                    1.0 if req.repetition_penalty is None else req.repetition_penalty
                ),
                seed=req.seed,
                stop=req.stop,
                stop_token_ids=list(req.stop_token_ids or []),
                include_stop_str_in_output=bool(req.include_stop_str_in_output),
                ignore_eos=bool(req.ignore_eos),
                max_tokens=max_tokens,
                min_tokens=req.min_tokens or 0,
                logprobs=logprobs,
                skip_special_tokens=req.skip_special_tokens is not False,
                structured_outputs=structured_outputs,
            )
        except ValueError as exc:
            raise invalid_request(exc) from None

    def check_context_length(self, token_ids: list[int], max_tokens: int | None, param: str) -> int:
        """Check that a tokenized prompt and ``max_tokens`` fit in the context
        (``validation.check_context_length``), naming the request's own field
        (``param``: ``prompt``, or ``messages`` for a chat). The engine checks the
        rest of the prompt (empty, ids outside the vocabulary).

        Returns:
            ``max_tokens``, or the room left in the context when it is None.
        Raises:
            OpenAIError: 400 (code ``context_length_exceeded``).
        """
        try:
            return check_context_length(
                len(token_ids), max_tokens, self.engine.max_model_len, param
            )
        except InvalidRequestError as exc:
            raise invalid_request(exc) from None

    async def start(
        self,
        prompts: list[TokensPrompt],
        params: SamplingParams | BeamSearchParams,
        request_id: str,
        raw: Request,
        priority: int = 0,
        lora_request: LoRARequest | None = None,
    ) -> AsyncGenerator[tuple[int, RequestOutput], None]:
        """Submit one engine request per prompt and wait for each first output,
        so that rejections become HTTP errors before a response starts
        (``priority``: the scheduler's, lower first; ``lora_request``: the
        adapter ``check_model`` found, None for the base model).

        Returns:
            the merged outputs ``(prompt index, output)``; closing it aborts the
            requests still running.
        Raises:
            OpenAIError: 400 / 503 / 500 from the engine's rejection.
            ClientDisconnected: the client left meanwhile (requests aborted).
        """
        gens = [
            self.engine.generate(
                p,
                params,
                f"{request_id}-{i}" if len(prompts) > 1 else request_id,
                priority=priority,
                lora_request=lora_request,
            )
            for i, p in enumerate(prompts)
        ]
        firsts = [asyncio.ensure_future(g.__anext__()) for g in gens]
        try:
            results = await until_disconnected(asyncio.gather(*firsts, return_exceptions=True), raw)
        except BaseException:
            await _cancel_all(firsts, gens)
            raise
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            await _cancel_all(firsts, gens)
            raise engine_error(errors[0])
        outputs = [r for r in results if not isinstance(r, BaseException)]
        return merge([prepend(first, g) for first, g in zip(outputs, gens, strict=True)])

    @staticmethod
    def usage(finals: list[RequestOutput]) -> UsageInfo:
        """Token counts of the final outputs; ``prompt_tokens_details.cached_tokens``
        sums their prefix-cache hits (absent when a request never ran)."""
        prompt = sum(len(o.prompt_token_ids) for o in finals)
        completion = sum(len(c.token_ids) for o in finals for c in o.outputs)
        cached = [o.num_cached_tokens for o in finals]
        details = None
        if finals and all(c is not None for c in cached):
            details = PromptTokenUsageInfo(cached_tokens=sum(c or 0 for c in cached))
        return UsageInfo(
            prompt_tokens=prompt,
            completion_tokens=completion,
            total_tokens=prompt + completion,
            prompt_tokens_details=details,
        )


async def _cancel_all(firsts: Sequence[asyncio.Future[Any]], gens: list[Any]) -> None:
    for f in firsts:
        f.cancel()
    await asyncio.gather(*firsts, return_exceptions=True)
    for g in gens:
        try:
            await g.aclose()
        except Exception:
            pass
