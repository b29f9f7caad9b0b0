"""Reasoning between ``<think>`` and ``</think>``, split from the answer, whole
or streamed (vLLM's ``--reasoning-parser`` names and its ``reasoning_content``
field).

``deepseek_r1``: the chat template opens the think block itself, so the reply
is reasoning from its first character up to ``</think>`` (a ``<think>`` the
model writes anyway is dropped); a reply that never closes it is all
reasoning. ``qwen3``: a reply is reasoning only inside a ``<think>`` block it
opens, or before a ``</think>`` it writes (templates that open the block);
with neither (thinking turned off) it is all answer.

Structured outputs apply to the answer: ``constrain_answer`` makes the
grammar start after ``</think>`` (vLLM's structured outputs with a reasoning
parser).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from ....sampling_params import StructuredOutputsParams

START, END = "<think>", "</think>"


@dataclass
class ReasoningSplit:
    """A reply, or a piece of one, split: ``reasoning`` and ``content`` text
    (None where there is none)."""

    reasoning: str | None
    content: str | None


class ThinkTagReasoningParser:
    """One ``<think>`` block convention (see the module docs)."""

    name: ClassVar[str] = "deepseek_r1"
    # Whether a reply without either tag is reasoning (the template opened it).
    implicit_start: ClassVar[bool] = True

    def extract(self, text: str) -> ReasoningSplit:
        """Split a whole reply."""
        body = text[len(START) :] if text.startswith(START) else text
        end = body.find(END)
        if end >= 0:
            return ReasoningSplit(body[:end] or None, body[end + len(END) :] or None)
        if self.implicit_start or text.startswith(START):
            return ReasoningSplit(body or None, None)
        return ReasoningSplit(None, text or None)

    def constrain_answer(self, params: StructuredOutputsParams) -> StructuredOutputsParams:
        """``params`` applied to the answer only: the grammar starts after
        ``</think>``, the reasoning before it is free (optional for ``qwen3``,
        whose replies without a think block are all answer), so that the text
        this parser returns as content is what the constraint produced."""
        return replace(params, reasoning_end=END, reasoning_optional=not self.implicit_start)

    def stream(self) -> ReasoningStream:
        """A splitter for one reply arriving in pieces."""
        return ReasoningStream(self)


class Qwen3ReasoningParser(ThinkTagReasoningParser):
    """``--reasoning-parser qwen3``."""

    name = "qwen3"
    implicit_start = False


class ReasoningStream:
    """One streamed reply: ``feed`` each piece, then ``finish``. A tail that
    may be the start of a tag is held back until the next piece decides it.

    ``qwen3`` with neither tag cannot know from a reply's first characters
    whether a ``</think>`` will follow; it streams them as answer (the
    template decided: a template that opens the block makes the model write
    reasoning, and ``deepseek_r1`` is the parser for it)."""

    def __init__(self, parser: ThinkTagReasoningParser) -> None:
        self.parser = parser
        self.text = ""
        self.sent = 0  # characters of text decided and sent
        self.in_reasoning: bool | None = None  # None until the reply's start is known
        self.ended = False  # </think> seen

    def feed(self, piece: str) -> ReasoningSplit:
        """The reasoning and answer text ``piece`` makes certain."""
        self.text += piece
        return self._advance(final=False)

    def finish(self) -> ReasoningSplit:
        """The held-back rest at the end of the reply."""
        return self._advance(final=True)

    @property
    def reasoning_ended(self) -> bool:
        """Whether the answer has begun (structured outputs apply from here)."""
        return self.ended or self.in_reasoning is False

    def _advance(self, final: bool) -> ReasoningSplit:
        reasoning, content = "", ""
        if self.in_reasoning is None:
            if START.startswith(self.text) and not final:
                return ReasoningSplit(None, None)
            if self.text.startswith(START):
                self.sent, self.in_reasoning = len(START), True
            else:
                self.in_reasoning = self.parser.implicit_start
        if self.in_reasoning and not self.ended:
            rest = self.text[self.sent :]
            end = rest.find(END)
            if end >= 0:
                reasoning = rest[:end]
                self.sent += end + len(END)
                self.ended = True
            else:
                keep = 0 if final else _tail_prefix(rest, END)
                reasoning = rest[: len(rest) - keep]
                self.sent += len(reasoning)
        if self.ended or not self.in_reasoning:
            content = self.text[self.sent :]
            self.sent = len(self.text)
        return ReasoningSplit(reasoning or None, content or None)


def _tail_prefix(text: str, tag: str) -> int:
    """Length of the longest tail of ``text`` that is a proper prefix of ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
