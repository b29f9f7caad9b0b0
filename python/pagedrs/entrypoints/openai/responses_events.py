"""The output items of a Responses API reply and the streaming events that
build them (``response.output_item.added``, ``...delta``, ``...done``)."""

from __future__ import annotations

import json
import uuid
from typing import Any

from .chat_reply import ReplyPiece


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def reasoning_item(iid: str, text: str) -> dict[str, Any]:
    return {
        "type": "reasoning",
        "id": iid,
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
        "status": "completed",
    }


def message_item(iid: str, text: str | None, status: str) -> dict[str, Any]:
    content = [] if text is None else [{"type": "output_text", "text": text, "annotations": []}]
    return {
        "type": "message",
        "id": iid,
        "role": "assistant",
        "status": status,
        "content": content,
    }


def call_item(iid: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": iid,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


class EventWriter:
    """The streaming events of one response: output items opened as their
    text arrives and closed when the next one opens or the reply ends."""

    def __init__(self) -> None:
        self.sequence = 0
        self.output: list[dict[str, Any]] = []
        self.open: dict[str, Any] | None = None  # the item receiving text
        self.text = ""

    def emit(self, kind: str, **fields: Any) -> str:
        body = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(body)}\n\n"

    def _open(self, item: dict[str, Any]) -> list[str]:
        events = self.close()
        self.output.append(item)
        self.open, self.text = item, ""
        index = len(self.output) - 1
        events.append(self.emit("response.output_item.added", output_index=index, item=item))
        if item["type"] in ("message", "reasoning"):
            part = {"type": "output_text", "text": "", "annotations": []}
            if item["type"] == "reasoning":
                part = {"type": "reasoning_text", "text": ""}
            events.append(
                self.emit(
                    "response.content_part.added",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    part=part,
                )
            )
        return events

    def _text(self, kind: str, delta: str) -> list[str]:
        events = []
        if self.open is None or self.open["type"] != kind:
            item = (
                message_item(_id("msg"), None, "in_progress")
                if kind == "message"
                else {**reasoning_item(_id("rs"), ""), "content": [], "status": "in_progress"}
            )
            events += self._open(item)
        assert self.open is not None
        self.text += delta
        name = f"response.{'output' if kind == 'message' else 'reasoning'}_text.delta"
        extra: dict[str, Any] = {"logprobs": []} if kind == "message" else {}
        events.append(
            self.emit(
                name,
                item_id=self.open["id"],
                output_index=len(self.output) - 1,
                content_index=0,
                delta=delta,
                **extra,
            )
        )
        return events

    def piece(self, piece: ReplyPiece) -> list[str]:
        events = []
        if piece.reasoning:
            events += self._text("reasoning", piece.reasoning)
        if piece.content:
            events += self._text("message", piece.content)
        for call in piece.tool_calls:
            if call.id is not None:
                events += self._open(
                    call_item(_id("fc"), call.id, call.name or "", "", "in_progress")
                )
            if call.arguments and self.open is not None:
                self.text += call.arguments
                events.append(
                    self.emit(
                        "response.function_call_arguments.delta",
                        item_id=self.open["id"],
                        output_index=len(self.output) - 1,
                        delta=call.arguments,
                    )
                )
        return events

    def close(self) -> list[str]:
        """Events closing the open item (its full text in each ``done``)."""
        item, self.open = self.open, None
        if item is None:
            return []
        index = len(self.output) - 1
        events = []
        if item["type"] == "function_call":
            item.update(arguments=self.text, status="completed")
            events.append(
                self.emit(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    name=item["name"],
                    arguments=self.text,
                )
            )
        else:
            message = item["type"] == "message"
            part = (
                {"type": "output_text", "text": self.text, "annotations": []}
                if message
                else {"type": "reasoning_text", "text": self.text}
            )
            item.update(content=[part], status="completed")
            done = "response.output_text.done" if message else "response.reasoning_text.done"
            extra: dict[str, Any] = {"logprobs": []} if message else {}
            events.append(
                self.emit(
                    done,
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    text=self.text,
                    **extra,
                )
            )
            events.append(
                self.emit(
                    "response.content_part.done",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    part=part,
                )
            )
        events.append(self.emit("response.output_item.done", output_index=index, item=item))
        return events
