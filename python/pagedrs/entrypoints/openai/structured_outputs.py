"""A request's structured-output fields (OpenAI's ``response_format``, vLLM's
``structured_outputs`` and ``guided_*``) as one ``StructuredOutputsParams``, checked
with xgrammar off the event loop so that a bad schema, regex or grammar is a 400
naming its field before anything is queued."""

from __future__ import annotations

import asyncio
from dataclasses import fields as dataclass_fields
from typing import Any

from ...sampling_params import StructuredOutputsParams
from ...structured_output import validate
from .errors import OpenAIError, bad_request
from .protocol import SamplingRequest

_GUIDED = {
    "guided_json": "json",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
}
# vLLM fields with nothing to do here: one backend, and xgrammar never generates
# properties a schema does not name.
_IGNORED = {"disable_fallback", "disable_additional_properties"}
# Set by the server from --reasoning-parser, not by requests.
_SERVER_SET = {"reasoning_end", "reasoning_optional"}


def _sources(req: SamplingRequest) -> list[str]:
    """The request fields that ask for structured outputs."""
    found = []
    if req.response_format is not None and req.response_format.type != "text":
        found.append("response_format")
    if req.structured_outputs is not None:
        found.append("structured_outputs")
    found += [name for name in _GUIDED if getattr(req, name) is not None]
    return found


def _fields(req: SamplingRequest, source: str) -> dict[str, Any]:
    """``StructuredOutputsParams`` keyword arguments from the field ``source``."""
    if source == "response_format":
        fmt = req.response_format
        assert fmt is not None
        if fmt.type == "json_object":
            return {"json_object": True}
        if fmt.json_schema is None or fmt.json_schema.schema_ is None:
            raise bad_request(
                "response_format of type 'json_schema' needs json_schema.schema",
                "response_format",
            )
        return {"json": fmt.json_schema.schema_}
    if source == "structured_outputs":
        body = dict(req.structured_outputs or {})
        if body.get("structural_tag") is not None:
            raise bad_request("structured_outputs.structural_tag is not supported", source)
        for key in (*_IGNORED, "structural_tag"):
            body.pop(key, None)
        known = {f.name for f in dataclass_fields(StructuredOutputsParams)} - _SERVER_SET
        unknown = sorted(set(body) - known)
        if unknown:
            raise bad_request(
                f"structured_outputs has unknown fields {unknown}; known: {sorted(known)}", source
            )
        return body
    fields: dict[str, Any] = {_GUIDED[source]: getattr(req, source)}
    if req.guided_whitespace_pattern is not None:
        fields["whitespace_pattern"] = req.guided_whitespace_pattern
    return fields


async def structured_outputs_of(req: SamplingRequest) -> StructuredOutputsParams | None:
    """The request's structured outputs, validated (grammar built in a thread).

    Returns:
        None when the request asks for none (``response_format`` text or absent).
    Raises:
        OpenAIError: 400 naming the field: several kinds asked for, a malformed
            value, or an invalid schema, regex or grammar.
    """
    sources = _sources(req)
    if not sources:
        if req.guided_whitespace_pattern is not None:
            raise bad_request(
                "guided_whitespace_pattern needs guided_json", "guided_whitespace_pattern"
            )
        return None
    if len(sources) > 1:
        raise bad_request(
            f"only one kind of structured output may be set, got {', '.join(sources)}",
            sources[1],
        )
    source = sources[0]
    fields = _fields(req, source)
    guided_ws = source in _GUIDED and "whitespace_pattern" in fields
    param = "guided_whitespace_pattern" if guided_ws else source
    try:
        params = StructuredOutputsParams(**fields)
    except ValueError as exc:
        raise bad_request(str(exc), param) from None
    try:
        await asyncio.to_thread(validate, params)
    except ValueError as exc:
        raise OpenAIError(400, f"{source}: {exc}", param=source) from None
    return params
