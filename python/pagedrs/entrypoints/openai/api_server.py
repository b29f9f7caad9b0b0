"""The OpenAI-compatible HTTP server (FastAPI + uvicorn).

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions``,
``GET /v1/models``, ``GET /health`` (200, or 503 once the engine loop is dead),
``GET /metrics`` (Prometheus text) and ``POST /reset_prefix_cache`` (vLLM's:
``{"reset": true}``, or false while a request holds blocks; 501 where the
engine cannot, as replicas behind Ray Serve). With an API key, every ``/v1`` route
needs ``Authorization: Bearer <key>`` (401 otherwise). A request body over
``--max-request-body-bytes`` gets 413 without being read. Prompts are tokenized
off the event loop (:mod:`.tokenization`), so that one huge prompt does not hold
the other clients.

    pagedrs serve MODEL --host 127.0.0.1 --port 8000 [--api-key KEY]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
import logging
import os
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ...engine.async_llm import AsyncLLM
from ...engine.protocol import EngineClient
from .chat_options import ChatOptions
from .cli_args import DEFAULT_MAX_REQUEST_BODY_BYTES, add_serve_args, chat_options_of, engine_args
from .errors import OpenAIError, RequestBodyTooLarge, body_too_large, install_error_handlers
from .metrics import ServerMetrics
from .protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    DetokenizeResponse,
    ModelCard,
    ModelList,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
)
from .protocol_responses import ResponsesRequest
from .serving_chat import OpenAIServingChat
from .serving_completion import OpenAIServingCompletion
from .serving_engine import engine_error
from .serving_lora import (
    LoRAModules,
    add_lora_routes,
    parse_lora_modules,
    runtime_updating_allowed,
)
from .serving_responses import OpenAIServingResponses
from .serving_tokenization import OpenAIServingTokenization
from .streams import ClientDisconnected
from .tokenization import ServerTokenizer

logger = logging.getLogger(__name__)


class ApiKeyMiddleware:
    """Refuse ``/v1`` requests without ``Authorization: Bearer <api_key>`` (401),
    before their body is read.

    Args:
        app: the wrapped ASGI app.
        api_key: the accepted key.
    """

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.expected = api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1"):
            scheme, _, given = dict(scope["headers"]).get(b"authorization", b"").partition(b" ")
            # The scheme is case-insensitive (RFC 9110); the key is compared in constant time.
            if scheme.lower() != b"bearer" or not hmac.compare_digest(given.strip(), self.expected):
                err = OpenAIError(
                    401,
                    "Invalid or missing API key: send 'Authorization: Bearer <key>'.",
                    code="invalid_api_key",
                )
                await err.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)


class BodySizeLimitMiddleware:
    """Answer 413 to a request whose body is over ``max_bytes`` bytes, without
    reading it: at once when its Content-Length says so, else as soon as the bytes
    received pass the bound (the handler reading the body gets
    :class:`~.errors.RequestBodyTooLarge`, so at most ``max_bytes`` plus one chunk is
    ever held). uvicorn discards the rest of a refused body as it arrives and keeps
    the connection.

    Args:
        app: the wrapped ASGI app.
        max_bytes: the largest body accepted.
    Raises:
        ValueError: ``max_bytes`` < 1.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_request_body_bytes must be >= 1, got {max_bytes}")
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await body_too_large(self.max_bytes).response()(scope, receive, send)
            return
        received = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise RequestBodyTooLarge(self.max_bytes)
            return message

        async def watched_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, watched_send)
        except RequestBodyTooLarge:  # read outside a route (the app's handler answers there)
            if started:
                raise
            await body_too_large(self.max_bytes).response()(scope, receive, send)


def build_app(
    engine: EngineClient,
    served_model_names: list[str],
    *,
    api_key: str | None = None,
    root_model: str | None = None,
    shutdown_engine: bool = True,
    max_request_body_bytes: int = DEFAULT_MAX_REQUEST_BODY_BYTES,
    chat_options: ChatOptions | None = None,
    lora_modules: LoRAModules | None = None,
) -> FastAPI:
    """The ASGI app serving ``engine``.

    Args:
        engine: a running engine.
        served_model_names: names clients may put in ``model``; the first is
            the one reported by ``/v1/models`` first and in metrics.
        api_key: if set, the key ``/v1`` routes require.
        root_model: the model path or alias behind the names (for ``/v1/models``).
        shutdown_engine: shut the engine down when the app stops.
        max_request_body_bytes: the largest request body accepted (413 beyond).
        chat_options: chat template and tool-call / reasoning parsers.
        lora_modules: LoRA adapters served by name (``--lora-modules``), with
            the load / unload endpoints when
            ``PAGEDRS_ALLOW_RUNTIME_LORA_UPDATING`` is set.

    Raises:
        ValueError: no served model name, or ``max_request_body_bytes`` < 1.
    """
    if not served_model_names:
        raise ValueError("served_model_names must name at least one model")
    if max_request_body_bytes < 1:
        raise ValueError(f"max_request_body_bytes must be >= 1, got {max_request_body_bytes}")
    chat_options = chat_options or ChatOptions()
    tokenizer = ServerTokenizer(
        engine.tokenizer, engine.max_model_len, chat_template=chat_options.chat_template
    )

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        tokenizer.shutdown()
        if shutdown_engine:
            await asyncio.to_thread(engine.shutdown)

    app = FastAPI(title="pagedrs", lifespan=lifespan)
    install_error_handlers(app)

    @app.exception_handler(ClientDisconnected)
    async def _gone(_: Request, __: ClientDisconnected) -> Response:
        return Response(status_code=499)

    completions = OpenAIServingCompletion(engine, served_model_names, tokenizer)
    chat = OpenAIServingChat(engine, served_model_names, tokenizer, chat_options)
    tokenization = OpenAIServingTokenization(engine, served_model_names, tokenizer)
    responses = OpenAIServingResponses(chat)
    for serving in (completions, chat):  # LoRA (pagedrs.lora): adapter names as `model`
        serving.lora_modules = lora_modules
    metrics = ServerMetrics(engine, served_model_names[0])
    app.state.engine = engine
    app.state.metrics = metrics

    @app.post("/v1/completions", response_model=None)
    async def create_completion(body: CompletionRequest, raw: Request) -> Response:
        return await completions.create(body, raw)

    @app.post("/v1/chat/completions", response_model=None)
    async def create_chat_completion(body: ChatCompletionRequest, raw: Request) -> Response:
        return await chat.create(body, raw)

    @app.post("/v1/responses", response_model=None)
    async def create_response(body: ResponsesRequest, raw: Request) -> Response:
        return await responses.create(body, raw)

    @app.get("/v1/responses/{response_id}", response_model=None)
    async def retrieve_response(response_id: str) -> Response:
        return JSONResponse(responses.retrieve(response_id))

    @app.post("/tokenize", response_model=None)
    async def tokenize(body: TokenizeChatRequest | TokenizeCompletionRequest) -> Any:
        return await tokenization.tokenize(body)

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> DetokenizeResponse:
        return await tokenization.detokenize(body)

    @app.get("/v1/models")
    async def list_models() -> ModelList:
        return ModelList(
            data=[
                ModelCard(id=name, root=root_model or name, max_model_len=engine.max_model_len)
                for name in served_model_names
            ]
            + (lora_modules.cards(root_model) if lora_modules is not None else [])
        )

    @app.get("/health", response_model=None)
    async def health() -> Response:
        if not engine.is_running:
            return JSONResponse({"status": "dead"}, status_code=503)
        return Response(status_code=200)

    @app.post("/reset_prefix_cache", response_model=None)
    async def reset_prefix_cache() -> Response:
        try:
            reset = await engine.reset_prefix_cache()
        except NotImplementedError as exc:
            raise OpenAIError(501, str(exc), code="not_implemented") from None
        except Exception as exc:
            raise engine_error(exc) from None
        return JSONResponse({"reset": reset})

    @app.get("/metrics", response_model=None)
    async def prometheus_metrics() -> Response:
        content, media_type = metrics.render()
        return Response(content=content, media_type=media_type)

    if lora_modules is not None and runtime_updating_allowed():
        add_lora_routes(app, lora_modules)
    if api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=api_key)
    # Outermost: an oversized body is refused before anything else looks at it.
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=max_request_body_bytes)
    return app


def run_server(ns: argparse.Namespace) -> int:
    """Load the model, then serve it from one engine until interrupted
    (SIGINT / SIGTERM). ``--ray`` (replicas on Ray Serve) is ``pagedrs serve``'s
    other branch (``pagedrs.cli``), not this function's.

    Raises:
        ValueError: invalid arguments or model, ``--ray`` or
            ``--data-parallel-size`` > 1.
    """
    if ns.ray or ns.data_parallel_size > 1:
        raise ValueError(
            "--ray and --data-parallel-size > 1 run replicas on Ray Serve: use "
            "`pagedrs serve MODEL --ray --data-parallel-size N`"
        )
    chat_options = chat_options_of(ns)  # bad parser names fail before the model loads
    import uvicorn

    logging.basicConfig(level=ns.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    import torch

    cores = os.cpu_count() or 2
    if ns.engine_core_process:
        torch.set_num_threads(1)  # the front end runs no model
    else:
        torch.set_num_threads(max(1, ns.torch_threads or cores - 1))
    engine = AsyncLLM(
        engine_args(ns),
        max_waiting_requests=ns.max_waiting_requests,
        torch_threads=ns.torch_threads or cores,
        log_level=ns.log_level,
        engine_core_process=ns.engine_core_process,
    )
    names = ns.served_model_name or [ns.model]
    lora_modules = None  # LoRA (pagedrs.lora): --lora-modules, read before the engine starts
    if ns.enable_lora:
        pairs = parse_lora_modules(ns.lora_modules or [])
        lora_modules = LoRAModules(names, ns.max_lora_rank, pairs)
    elif ns.lora_modules:
        raise ValueError("--lora-modules needs --enable-lora")
    app = build_app(
        engine,
        names,
        api_key=ns.api_key,
        root_model=ns.model,
        max_request_body_bytes=ns.max_request_body_bytes,
        chat_options=chat_options,
        lora_modules=lora_modules,
    )
    logger.info("serving %s as %s on http://%s:%d", ns.model, names, ns.host, ns.port)
    config: dict[str, Any] = {"log_level": ns.log_level, "timeout_graceful_shutdown": 5}
    uvicorn.run(app, host=ns.host, port=ns.port, **config)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m pagedrs.entrypoints.openai.api_server``: ``pagedrs serve``
    with one engine (no ``--ray``)."""
    parser = argparse.ArgumentParser(description=__doc__)
    add_serve_args(parser)
    return run_server(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
