"""Tool calls read out of a model's text: the types, and the streaming reader
every format shares.

A format (``hermes.py``, ``llama3_json.py``, ...) says where its tool-call
section starts in the text and reads the calls the section holds so far
(``ToolParser.section_start``, ``ToolParser.read_section``). From these two,
``ToolParser.extract`` splits a whole reply into content and calls, and
``ToolCallStream`` turns a reply arriving in pieces into OpenAI's streamed
deltas: content up to the section (holding back a tail that may be the start
of its marker), then per call its index, id and name first and its arguments
in pieces, the exact characters the model wrote. A reply whose section does
not read as tool calls is returned as content, whole or streamed, never an
error.
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .json_scan import PartialCall


@dataclass
class ToolCall:
    """One complete call: ``arguments`` is the JSON object text."""

    id: str
    name: str
    arguments: str


@dataclass
class ExtractedToolCalls:
    """A whole reply split: ``content`` (None when only calls) and the calls."""

    content: str | None
    tool_calls: list[ToolCall]


@dataclass
class ToolCallDelta:
    """A streamed piece of call ``index``: its first piece carries ``id`` and
    ``name``, later ones only ``arguments`` text to append."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass
class StreamDelta:
    """What one piece of streamed text adds: content text and call pieces."""

    content: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)


def random_call_id() -> str:
    """An OpenAI-style tool call id (``call_`` and 24 hex digits)."""
    return f"call_{uuid.uuid4().hex[:24]}"


class ToolParser(ABC):
    """A tool-call format (vLLM's ``--tool-call-parser`` names)."""

    name: ClassVar[str]
    # Texts that may open the tool-call section: a reply's tail that is a
    # prefix of one of them is held back from streamed content.
    markers: ClassVar[tuple[str, ...]]

    @abstractmethod
    def section_start(self, text: str) -> int | None:
        """Index where the tool-call section begins in ``text``, or None."""

    @abstractmethod
    def read_section(self, section: str, final: bool) -> list[PartialCall] | None:
        """The calls of ``section`` (from ``section_start`` on) so far, in
        order; None when it is not (or, ``final``, did not end as) a call
        section of this format."""

    def structural_tag(
        self, schemas: dict[str, dict[str, Any]], *, required: bool, single: bool
    ) -> dict[str, Any] | None:
        """An xgrammar structural tag holding this format's calls to their
        functions' schemas (``--structured-tool-calls``), or None when the
        format has no tag-delimited form to constrain.

        Args:
            schemas: function name -> its parameters' JSON schema.
            required: the reply is calls only, at least one (``"required"``,
                a named function); else free text in which each call after
                its start tag is constrained (``"auto"``).
            single: one call, then the reply ends.
        """
        return None

    def new_call_id(self) -> str:
        """The id given to a call."""
        return random_call_id()

    def extract(self, text: str) -> ExtractedToolCalls:
        """Split a whole reply into content and tool calls; a section that
        does not read as complete calls leaves the whole reply as content."""
        start = self.section_start(text)
        if start is None:
            return ExtractedToolCalls(text, [])
        calls = self.read_section(text[start:], final=True)
        if not calls or any(c.name is None or not c.arguments_done for c in calls):
            return ExtractedToolCalls(text, [])
        content = text[:start].strip() or None
        return ExtractedToolCalls(
            content,
            [ToolCall(self.new_call_id(), c.name or "", c.arguments) for c in calls],
        )

    def stream(self) -> ToolCallStream:
        """A reader for one reply arriving in pieces."""
        return ToolCallStream(self)


def held_back(text: str, markers: tuple[str, ...]) -> int:
    """Length of the longest tail of ``text`` that is a proper prefix of a marker."""
    best = 0
    for m in markers:
        for n in range(min(len(m) - 1, len(text)), best, -1):
            if text.endswith(m[:n]):
                best = n
                break
    return best


class ToolCallStream:
    """One streamed reply: ``feed`` each text piece, then ``finish``."""

    def __init__(self, parser: ToolParser) -> None:
        self.parser = parser
        self.text = ""
        self.content_sent = 0  # characters of text sent as content
        self.ids: list[str] = []  # calls whose header was sent
        self.arguments_sent: list[int] = []

    @property
    def called(self) -> bool:
        """Whether any tool call was streamed (finish_reason ``tool_calls``)."""
        return bool(self.ids)

    def feed(self, piece: str) -> StreamDelta:
        """The deltas that ``piece`` makes certain."""
        self.text += piece
        return self._advance(final=False)

    def finish(self) -> StreamDelta:
        """The rest, at the end of the reply: held-back text, the last
        arguments, or, for a section that did not read as calls and sent no
        call, the section as content."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> StreamDelta:
        delta = StreamDelta()
        start = self.parser.section_start(self.text)
        if start is None:
            end = (
                len(self.text)
                if final
                else len(self.text) - held_back(self.text, self.parser.markers)
            )
            delta.content = self.text[self.content_sent : end]
            self.content_sent = max(self.content_sent, end)
            return delta
        if self.content_sent < start:
            delta.content = self.text[self.content_sent : start]
            self.content_sent = start
        calls = self.parser.read_section(self.text[start:], final)
        if calls is None:
            if final and not self.ids:
                delta.content += self.text[self.content_sent :]
                self.content_sent = len(self.text)
            return delta
        for index, call in enumerate(calls):
            if call.name is None:
                break
            if index == len(self.ids):
                self.ids.append(self.parser.new_call_id())
                self.arguments_sent.append(0)
                delta.tool_calls.append(ToolCallDelta(index, self.ids[index], call.name))
            new = call.arguments[self.arguments_sent[index] :]
            if new:
                self.arguments_sent[index] = len(call.arguments)
                if delta.tool_calls and delta.tool_calls[-1].index == index:
                    delta.tool_calls[-1].arguments += new
                else:
                    delta.tool_calls.append(ToolCallDelta(index, arguments=new))
        return delta
