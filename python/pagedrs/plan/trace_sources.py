"""A trace by name: one of the planner's sources, or a JSONL file.

Sources:

* ``sharegpt`` / ``alpaca``: the ShareGPT-like and Alpaca-like records of the
  benchmark data folder (``$PAGEDRS_DATA``, else ``../shared/data`` beside the
  checkout or the working directory): the prompt is the conversation (or
  instruction + input) under the tokenizer's chat template, the output length
  is the token length of the recorded answer.
* ``chat``: multi-turn chat sessions over shared system prompts (the
  ShareGPT-like answers as system prompts, Alpaca-like instructions as user
  turns, their answers as the assistant's replies): turn ``k`` sends the
  system prompt and the whole history, and arrives ``think_s`` after turn
  ``k - 1`` finishes, so prefixes repeat as in a chat service.
* a JSONL file, one request a line: ``output_len`` and either
  ``prompt_len`` or ``prompt_token_ids``; optional ``arrival_s`` (s from the
  start), ``prefix_group`` with ``prefix_len`` (requests of one group share
  their first ``prefix_len`` prompt tokens).

Arrivals: a file's own ``arrival_s``, or a Poisson process at a rate
(:meth:`Trace.with_poisson`), the same requests at every rate.

The requests are :class:`.trace.Trace`; each source is a module of its own:
:mod:`.dataset_trace` (the data folder, ``sharegpt`` / ``alpaca``),
:mod:`.chat_trace`, :mod:`.jsonl_trace`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .chat_trace import chat_trace
from .dataset_trace import dataset_trace, load_tokenizer
from .jsonl_trace import read_jsonl_trace
from .trace import Trace

__all__ = ["load_trace"]


def load_trace(
    name: str,
    *,
    tokenizer: Any = None,
    num_requests: int | None = None,
    max_prompt_len: int = 1024,
    max_output_len: int = 1024,
    sessions: int = 64,
    turns: int = 4,
    system_prompts: int = 8,
    system_len: int = 512,
    reply_len: int = 128,
    think_s: float = 2.0,
) -> Trace:
    """A named trace or a JSONL file.

    Args:
        name: "sharegpt", "alpaca", "chat", or a path to a ``.jsonl`` file.
        tokenizer: a transformers tokenizer or model name (default: the
            engine's default model's).
        num_requests: keep the first this many (sharegpt / alpaca / JSONL).
        max_prompt_len, max_output_len: records with longer prompts are
            skipped, outputs capped (sharegpt / alpaca).
        sessions, turns, system_prompts, system_len, reply_len, think_s: the
            chat trace's shape (tokens for lengths, seconds for think time).
    Raises:
        ValueError: an unknown name, missing data, or a bad JSONL line (named).
    """
    if name.endswith(".jsonl") or Path(name).is_file():
        tr = read_jsonl_trace(name)
        return tr.head(num_requests) if num_requests else tr
    if name not in ("sharegpt", "alpaca", "chat"):
        raise ValueError(f"unknown trace {name!r}: sharegpt, alpaca, chat or a .jsonl file")
    tok = load_tokenizer(tokenizer)
    if name == "chat":
        return chat_trace(tok, sessions, turns, system_prompts, system_len, reply_len, think_s)
    return dataset_trace(name, tok, num_requests, max_prompt_len, max_output_len)
