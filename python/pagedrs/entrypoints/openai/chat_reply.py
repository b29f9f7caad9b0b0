"""One chat choice's text read as the client sees it: reasoning (``--reasoning-parser``),
then the answer, whose tool calls the request's ``ToolPlan`` reads out; whole
(``ChoiceReader.whole``) or as streamed pieces (``feed``, ``finish``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .chat_options import ChatOptions
from .chat_tools import ToolPlan
from .tool_parsers import ToolCall, ToolCallDelta


@dataclass
class WholeReply:
    """A finished choice: reasoning, answer text and tool calls."""

    reasoning: str | None
    content: str | None
    tool_calls: list[ToolCall]


@dataclass
class ReplyPiece:
    """What a streamed piece of text adds to the choice."""

    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)

    def then(self, other: ReplyPiece) -> ReplyPiece:
        """This piece followed by ``other``, as one."""
        return ReplyPiece(
            self.reasoning + other.reasoning,
            self.content + other.content,
            self.tool_calls + other.tool_calls,
        )

    def is_empty(self) -> bool:
        return not (self.reasoning or self.content or self.tool_calls)


class ChoiceReader:
    """Reads one choice (see the module docs)."""

    def __init__(self, plan: ToolPlan, options: ChatOptions) -> None:
        self.plan = plan
        self.reasoning_parser = options.reasoning()
        self.reasoning = None if self.reasoning_parser is None else self.reasoning_parser.stream()
        self.tools = None if plan.parser is None else plan.parser.stream()

    @property
    def called(self) -> bool:
        """Whether a tool call was streamed."""
        return self.tools is not None and self.tools.called

    def whole(self, text: str) -> WholeReply:
        """The finished choice ``text`` split."""
        reasoning, content = None, text
        if self.reasoning_parser is not None:
            split = self.reasoning_parser.extract(text)
            reasoning, content = split.reasoning, split.content or ""
        extracted = self.plan.extract(content)
        answer = extracted.content
        if self.reasoning_parser is not None and not answer:
            answer = None
        return WholeReply(reasoning, answer, extracted.tool_calls)

    def feed(self, text: str) -> ReplyPiece:
        """What ``text``, the choice's next characters, makes certain."""
        return self._answer(self._split(text, final=False), final=False)

    def finish(self) -> ReplyPiece:
        """What was held back, at the end of the choice."""
        return self._answer(self._split("", final=True), final=True)

    def _split(self, text: str, final: bool) -> tuple[str, str]:
        if self.reasoning is None:
            return "", text
        split = self.reasoning.finish() if final else self.reasoning.feed(text)
        return split.reasoning or "", split.content or ""

    def _answer(self, parts: tuple[str, str], final: bool) -> ReplyPiece:
        reasoning, content = parts
        if self.tools is None:
            return ReplyPiece(reasoning, content)
        delta = self.tools.feed(content)
        if final:
            end = self.tools.finish()
            delta.content += end.content
            delta.tool_calls += end.tool_calls
        return ReplyPiece(reasoning, delta.content, delta.tool_calls)
