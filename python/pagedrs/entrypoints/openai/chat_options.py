"""The server's chat settings: a chat template to use instead of the model's,
and the tool-call and reasoning parsers (vLLM's flags
``--chat-template``, ``--enable-auto-tool-choice``, ``--tool-call-parser``,
``--reasoning-parser``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .reasoning import REASONING_PARSERS, ThinkTagReasoningParser, get_reasoning_parser
from .tool_parsers import TOOL_PARSERS, ToolParser, get_tool_parser


@dataclass(frozen=True)
class ChatOptions:
    """Chat settings of a server.

    Attributes:
        chat_template: a Jinja chat template used instead of the model's (None:
            the model's own).
        enable_auto_tool_choice: ``tool_choice="auto"`` is served (the model
            decides; ``tool_call_parser`` reads its calls).
        tool_call_parser: one of ``TOOL_PARSERS`` or None.
        structured_tool_calls: tool calls are constrained to the parser's own
            format with the tools' schemas (``ToolParser.structural_tag``):
            ``"auto"`` after the call's start tag, ``"required"`` and a named
            function the whole reply (``chat_tools.plan_tools``).
        reasoning_parser: one of ``REASONING_PARSERS`` or None.

    Raises:
        ValueError: an unknown parser name, auto tool choice without a parser,
            or structured tool calls without a parser that has a structural form.
    """

    chat_template: str | None = None
    enable_auto_tool_choice: bool = False
    tool_call_parser: str | None = None
    structured_tool_calls: bool = False
    reasoning_parser: str | None = None

    def __post_init__(self) -> None:
        if self.tool_call_parser is not None and self.tool_call_parser not in TOOL_PARSERS:
            get_tool_parser(self.tool_call_parser)
        if self.reasoning_parser is not None and self.reasoning_parser not in REASONING_PARSERS:
            get_reasoning_parser(self.reasoning_parser)
        if self.enable_auto_tool_choice and self.tool_call_parser is None:
            raise ValueError("--enable-auto-tool-choice needs --tool-call-parser")
        if self.structured_tool_calls:
            parser = self.tool_parser()
            if parser is None or parser.structural_tag({}, required=False, single=False) is None:
                raise ValueError(
                    "--structured-tool-calls needs a --tool-call-parser with a structural "
                    "form (hermes)"
                )

    def tool_parser(self) -> ToolParser | None:
        """A parser of the configured format, or None."""
        return None if self.tool_call_parser is None else get_tool_parser(self.tool_call_parser)

    def reasoning(self) -> ThinkTagReasoningParser | None:
        """The configured reasoning parser, or None."""
        name = self.reasoning_parser
        return None if name is None else get_reasoning_parser(name)


def load_chat_template(value: str) -> str:
    """``--chat-template``: a file's text, or the value itself when it is not
    a file (a template given inline, as vLLM accepts).

    Raises:
        ValueError: a value that looks like a path (no Jinja markup) but names no file.
    """
    path = Path(value)
    if path.is_file():
        return path.read_text()
    if "{%" not in value and "{{" not in value:
        raise ValueError(f"--chat-template {value!r}: no such file, and not a Jinja template")
    return value
