"""Errors in OpenAI's schema, and the app's exception handlers.

Every error body is ``{"error": {"message", "type", "param", "code"}}``. Bad
input is a 400 (FastAPI's 422 for validation errors and malformed JSON is
replaced), an unknown model 404, a request body over the server's bound 413, a
full waiting queue 503; a 500 means a bug or a failure inside the model loop,
never bad input.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .protocol import ErrorInfo, ErrorResponse

logger = logging.getLogger(__name__)

_STATUS_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    503: "server_error",
}


class OpenAIError(Exception):
    """An error answered in OpenAI's schema.

    Args:
        status: HTTP status code.
        message: human-readable explanation.
        param: the request field at fault, if any.
        code: machine-readable code (e.g. ``context_length_exceeded``).
        type: OpenAI error type (default from the status).
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        type: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or _STATUS_TYPES.get(status, "server_error")

    def body(self) -> dict[str, Any]:
        """The JSON body."""
        info = ErrorInfo(message=self.message, type=self.type, param=self.param, code=self.code)
        return ErrorResponse(error=info).model_dump()

    def response(self) -> JSONResponse:
        """The HTTP response."""
        return JSONResponse(self.body(), status_code=self.status)

    def sse(self) -> str:
        """The error as one server-sent event (for failures after a stream began)."""
        return f"data: {json.dumps(self.body())}\n\n"


def bad_request(message: str, param: str | None = None, code: str | None = None) -> OpenAIError:
    """A 400 ``invalid_request_error``."""
    return OpenAIError(400, message, param=param, code=code)


def body_too_large(max_bytes: int) -> OpenAIError:
    """The 413 for a request body over ``max_bytes`` bytes."""
    return OpenAIError(
        413,
        f"the request body is over this server's limit of {max_bytes} bytes "
        "(--max-request-body-bytes)",
        code="request_too_large",
    )


class RequestBodyTooLarge(StarletteHTTPException):
    """Raised to the code reading a request body once it passes ``max_bytes``
    bytes; answered as :func:`body_too_large`.

    Args:
        max_bytes: the bound passed.
    """

    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, body_too_large(max_bytes).message)
        self.max_bytes = max_bytes


def invalid_request(exc: ValueError) -> OpenAIError:
    """The 400 of a refused request: an ``InvalidRequestError``'s ``param`` and
    ``code`` as they are (None for any other ``ValueError``)."""
    return OpenAIError(
        400,
        str(exc),
        param=getattr(exc, "param", None),
        code=getattr(exc, "code", None),
    )


def _loc_path(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc[1:]] if loc and loc[0] == "body" else [str(p) for p in loc]
    return ".".join(parts)


def validation_error(exc: RequestValidationError) -> OpenAIError:
    """A 400 describing pydantic's errors (at most three), param = first field."""
    errors = list(exc.errors())
    if not errors:
        return bad_request("invalid request")
    first = errors[0]
    if first.get("type") == "json_invalid":
        detail = (first.get("ctx") or {}).get("error", "")
        return bad_request(f"malformed JSON body: {detail}".rstrip(": "), code="invalid_json")
    loc = tuple(first.get("loc", ()))
    if loc == ("body",) and first.get("type") == "missing":
        return bad_request("the request body is missing: send a JSON object")
    if loc == ("body",):
        return bad_request(
            "the request body must be a JSON object sent with 'Content-Type: application/json' "
            f"({first.get('msg')})"
        )
    param = str(loc[1]) if len(loc) > 1 and loc[0] == "body" else None
    parts = []
    for e in errors[:3]:
        where = _loc_path(tuple(e.get("loc", ())))
        got = e.get("input")
        shown = "" if e.get("type") == "missing" else f" (got {json.dumps(got, default=str)})"
        parts.append(f"{where}: {e.get('msg')}{shown}")
    return bad_request("; ".join(parts), param=param)


def install_error_handlers(app: FastAPI) -> None:
    """Answer validation errors, HTTP errors and crashes in OpenAI's schema."""

    @app.exception_handler(OpenAIError)
    async def _openai(_: Request, exc: OpenAIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return validation_error(exc).response()

    @app.exception_handler(RequestBodyTooLarge)
    async def _too_large(_: Request, exc: RequestBodyTooLarge) -> JSONResponse:
        return body_too_large(exc.max_bytes).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
        return OpenAIError(exc.status_code, message).response()

    @app.exception_handler(Exception)
    async def _crash(_: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error")
        return OpenAIError(
            500, f"internal server error: {type(exc).__name__}", type="server_error"
        ).response()
