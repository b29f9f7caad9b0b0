"""A chat request's tools: checked, rendered into the chat template, and read
back out of the reply (OpenAI's ``tools`` / ``tool_choice`` semantics).

``tool_choice``:

- ``"none"``: the tools are shown to the template, no call is read.
- ``"auto"`` (the default with tools): the server's ``--tool-call-parser``
  reads the calls the model chose to write (needs ``--enable-auto-tool-choice``).
- ``"required"``: the reply is constrained (xgrammar, through structured
  outputs) to a JSON array of ``{"name", "parameters"}`` objects, at least one
  (exactly one without ``parallel_tool_calls``), each valid against its
  function's schema.
- a named function: the reply is constrained to that function's arguments,
  a JSON object valid against its schema.

So with ``"required"`` or a named function the arguments always parse and
match the schema (unless ``max_tokens`` cuts the reply: ``finish_reason``
``"length"``, the text returned as content).

With ``--structured-tool-calls`` (``ChatOptions.structured_tool_calls``) calls
are held to the tool-call parser's own format instead (its structural tag,
``ToolParser.structural_tag``): with ``"auto"`` the text is free and each call
after the parser's start tag (hermes' ``<tool_call>``) names a tool and has
arguments valid against its schema; ``"required"`` and a named function are
calls in that format only. The chat template renders such a call back into
the history as the same text, so the next turn finds it in the prefix cache.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from ...sampling_params import StructuredOutputsParams
from .chat_options import ChatOptions
from .errors import bad_request
from .protocol import ChatCompletionRequest, ChatMessage, NamedToolChoice
from .tool_parsers import ExtractedToolCalls, ToolParser
from .tool_parsers.json_scan import PartialCall, read_call_array, skip_ws, value_end

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_ANY_OBJECT: dict[str, Any] = {"type": "object"}


@dataclass
class ToolPlan:
    """How one request's reply is read.

    Attributes:
        mode: ``"none"``, ``"auto"``, ``"required"`` or ``"named"``.
        template_tools: the tools as the chat template takes them (None: no tools).
        structured: the constraint of ``"required"`` / ``"named"``.
        parser: what reads the calls out of the reply (None for ``"none"``).
    """

    mode: Literal["none", "auto", "required", "named"]
    template_tools: list[dict[str, Any]] | None
    structured: StructuredOutputsParams | None
    parser: ToolParser | None

    def extract(self, text: str) -> ExtractedToolCalls:
        """The reply split into content and calls."""
        if self.parser is None:
            return ExtractedToolCalls(text, [])
        return self.parser.extract(text)


def _check_schema(schema: dict[str, Any], i: int) -> None:
    import jsonschema

    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise bad_request(
            f"tools[{i}].function.parameters is not a valid JSON Schema: {exc.message}",
            "tools",
        ) from None


def plan_tools(req: ChatCompletionRequest, options: ChatOptions, template: str | None) -> ToolPlan:
    """Check ``tools`` / ``tool_choice`` and plan the reply's reading.

    Raises:
        OpenAIError: 400 naming ``tools`` (a bad name, a duplicate, a schema
            that is not JSON Schema, a chat template that shows no tools) or
            ``tool_choice`` (a function not among ``tools``, ``"auto"`` on a
            server without ``--enable-auto-tool-choice``, a choice without
            tools, together with ``response_format``).
    """
    tools = req.tools or []
    choice = req.tool_choice
    if choice is None:
        choice = "auto" if tools else "none"
    if not tools:
        if choice != "none":
            raise bad_request("tool_choice needs tools", "tool_choice")
        return ToolPlan("none", None, None, None)
    schemas: dict[str, dict[str, Any]] = {}
    for i, tool in enumerate(tools):
        name = tool.function.name
        if not _NAME.match(name):
            raise bad_request(
                f"tools[{i}].function.name {name!r} must be 1-64 letters, digits, '_' or '-'",
                "tools",
            )
        if name in schemas:
            raise bad_request(f"tools[{i}]: a second function named {name!r}", "tools")
        params = tool.function.parameters
        if params is not None:
            _check_schema(params, i)
        schemas[name] = params if params is not None else _ANY_OBJECT
    if template is None or "tools" not in template:
        raise bad_request(
            "the chat template of this model does not show tools to the model: start the "
            "server with --chat-template giving one that renders 'tools'",
            "tools",
        )
    template_tools = [t.model_dump(exclude_none=True) for t in tools]
    if choice == "none":
        return ToolPlan("none", template_tools, None, None)
    if choice == "auto":
        parser = options.tool_parser()
        if not options.enable_auto_tool_choice or parser is None:
            raise bad_request(
                '"auto" tool choice needs a server started with --enable-auto-tool-choice '
                "and --tool-call-parser",
                "tool_choice",
            )
        tag = None
        if options.structured_tool_calls:
            tag = parser.structural_tag(schemas, required=False, single=False)
        structured = None
        if tag is not None:  # forced text as the tokenizer's tokens: see _native_plan
            structured = StructuredOutputsParams(structural_tag=tag, jump_forward=True)
        return ToolPlan("auto", template_tools, structured, parser)
    if req.response_format is not None and req.response_format.type != "text":
        raise bad_request(
            "tool_choice 'required' or a named function cannot be combined with response_format",
            "tool_choice",
        )
    if isinstance(choice, NamedToolChoice):
        name = choice.function.name
        if name not in schemas:
            raise bad_request(
                f"tool_choice names function {name!r}, which is not among tools", "tool_choice"
            )
        native = _native_plan("named", {name: schemas[name]}, True, template_tools, options)
        if native is not None:
            return native
        return ToolPlan(
            "named",
            template_tools,
            StructuredOutputsParams(json=schemas[name]),
            NamedCallParser(name),
        )
    single = req.parallel_tool_calls is False
    native = _native_plan("required", schemas, single, template_tools, options)
    if native is not None:
        return native
    items = [
        {
            "type": "object",
            "properties": {"name": {"type": "string", "enum": [n]}, "parameters": s},
            "required": ["name", "parameters"],
        }
        for n, s in schemas.items()
    ]
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": items}}
    if single:
        schema["maxItems"] = 1
    return ToolPlan("required", template_tools, StructuredOutputsParams(json=schema), CallArray())


def _native_plan(
    mode: Literal["required", "named"],
    schemas: dict[str, dict[str, Any]],
    single: bool,
    template_tools: list[dict[str, Any]],
    options: ChatOptions,
) -> ToolPlan | None:
    """With ``--structured-tool-calls``: calls only, at least one, in the
    parser's own format (its structural tag), read back by that parser; None
    without the flag. The text the tag forces (the call's tags, a forced
    function name, the argument keys) is written as the tokenizer's own tokens
    (``jump_forward``), so the chat template's rendering of the call back in
    the history gives the tokens generated."""
    parser = options.tool_parser() if options.structured_tool_calls else None
    if parser is None:
        return None
    tag = parser.structural_tag(schemas, required=True, single=single)
    if tag is None:
        return None
    structured = StructuredOutputsParams(structural_tag=tag, jump_forward=True)
    return ToolPlan(mode, template_tools, structured, parser)


def template_message(m: ChatMessage, content: str) -> dict[str, Any]:
    """A message as chat templates take it: an assistant's tool calls with
    their arguments as a mapping (templates write them with ``tojson``), a
    tool message with its ``tool_call_id``."""
    msg: dict[str, Any] = {"role": m.role, "content": content}
    if m.name is not None:
        msg["name"] = m.name
    if m.tool_call_id is not None:
        msg["tool_call_id"] = m.tool_call_id
    if m.reasoning_content is not None:
        msg["reasoning_content"] = m.reasoning_content
    if m.tool_calls:
        calls = []
        for c in m.tool_calls:
            try:
                arguments: Any = json.loads(c.function.arguments)
            except ValueError:
                arguments = c.function.arguments
            calls.append(
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.function.name, "arguments": arguments},
                }
            )
        msg["tool_calls"] = calls
    return msg


class NamedCallParser(ToolParser):
    """The reply of a named ``tool_choice``: the arguments object itself."""

    name = "named"
    markers = ("{",)

    def __init__(self, function: str) -> None:
        self.function = function

    def section_start(self, text: str) -> int | None:
        return 0

    def read_section(self, section: str, final: bool) -> list[PartialCall] | None:
        i = skip_ws(section, 0)
        if i >= len(section):
            return None if final else [PartialCall(self.function, "", False, None)]
        end = value_end(section, i)
        if end is None:
            if final or section[i] != "{":
                return None
            return [PartialCall(self.function, section[i:], False, None)]
        try:
            if not isinstance(json.loads(section[i:end]), dict):
                return None
        except ValueError:
            return None
        return [PartialCall(self.function, section[i:end], True, end)]


class CallArray(ToolParser):
    """The reply of ``tool_choice="required"``: ``[{"name", "parameters"}, ...]``."""

    name = "required"
    markers = ("[",)

    def section_start(self, text: str) -> int | None:
        return 0

    def read_section(self, section: str, final: bool) -> list[PartialCall] | None:
        i = skip_ws(section, 0)
        if i >= len(section):
            return None if final else []
        if section[i] != "[":
            return None
        return read_call_array(section, i, final, allow_empty=False)
