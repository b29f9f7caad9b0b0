"""Traces the planner replays: requests with prompt tokens, an output length
and an arrival time.

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

This module holds the requests and :func:`load_trace`; each source is a module
of its own: :mod:`.dataset_trace` (the data folder, ``sharegpt`` / ``alpaca``),
:mod:`.chat_trace`, :mod:`.jsonl_trace`.
"""

from __future__ import annotations

import math
import random
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["Trace", "TraceRequest", "lengths", "load_trace", "synth_ids"]

#: Token ids synthesized for length-only prompts are drawn from this range.
_SYNTH_VOCAB = (100, 30000)


@dataclass
class TraceRequest:
    """One request.

    Attributes:
        prompt: int64 ``[prompt_len]`` prompt token ids.
        output_len: tokens to generate (exactly: no stop token).
        arrival_s: arrival time, s from the trace's start (for a follow-up
            turn: ignored, see ``follows``).
        output_ids: int64 ``[output_len]`` the reply's tokens, when known (so
            a later turn that repeats them finds them cached), else None.
        follows: index of the request this one answers (a chat turn): it
            arrives ``think_s`` after that request finishes.
        think_s: seconds between ``follows`` finishing and this arrival.
        session: label of the chat session or prefix group, or None.
    """

    prompt: np.ndarray
    output_len: int
    arrival_s: float = 0.0
    output_ids: np.ndarray | None = None
    follows: int | None = None
    think_s: float = 0.0
    session: str | None = None


@dataclass
class Trace:
    """A named list of requests.

    Attributes:
        name: label.
        requests: the requests, in arrival order of the first turns.
        timed: whether ``arrival_s`` are real times (else a rate sets them).
    """

    name: str
    requests: list[TraceRequest]
    timed: bool = False
    meta: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.requests)

    def with_poisson(self, rate: float, seed: int = 0) -> Trace:
        """The same requests arriving as a Poisson process of ``rate`` req/s
        (first at 0; ``inf``: all at 0). Follow-up turns keep their rule.

        Raises:
            ValueError: rate <= 0.
        """
        if not rate > 0:
            raise ValueError(f"request rate must be > 0, got {rate}")
        rng = random.Random(seed)
        t = 0.0
        out = []
        for r in self.requests:
            if r.follows is None:
                out.append(replace(r, arrival_s=t))
                if math.isfinite(rate):
                    t += rng.expovariate(rate)
            else:
                out.append(r)
        return Trace(f"{self.name}@{rate:g}", out, True, dict(self.meta, rate=rate))

    def head(self, n: int) -> Trace:
        """The first ``n`` requests (and the turns they lead to)."""
        keep = [r for i, r in enumerate(self.requests[:n])]
        return Trace(self.name, keep, self.timed, dict(self.meta))

    def stats(self) -> dict[str, float]:
        """Mean prompt and output lengths, request count."""
        p = [len(r.prompt) for r in self.requests]
        o = [r.output_len for r in self.requests]
        return {
            "num_requests": len(p),
            "mean_prompt_len": float(np.mean(p)) if p else 0.0,
            "mean_output_len": float(np.mean(o)) if o else 0.0,
        }


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
    # The sources import this module's types: imported here, not at the top.
    from .chat_trace import chat_trace
    from .dataset_trace import dataset_trace, load_tokenizer
    from .jsonl_trace import read_jsonl_trace

    if name.endswith(".jsonl") or Path(name).is_file():
        tr = read_jsonl_trace(name)
        return tr.head(num_requests) if num_requests else tr
    if name not in ("sharegpt", "alpaca", "chat"):
        raise ValueError(f"unknown trace {name!r}: sharegpt, alpaca, chat or a .jsonl file")
    tok = load_tokenizer(tokenizer)
    if name == "chat":
        return chat_trace(tok, sessions, turns, system_prompts, system_len, reply_len, think_s)
    return dataset_trace(name, tok, num_requests, max_prompt_len, max_output_len)


def synth_ids(n: int, key: str) -> np.ndarray:
    """``n`` token ids drawn from a generator seeded by ``key`` (the same
    ids for the same key in every process): int64 ``[n]``."""
    rng = np.random.default_rng(zlib.crc32(key.encode()))
    return rng.integers(*_SYNTH_VOCAB, size=n, dtype=np.int64)


def lengths(requests: Sequence[TraceRequest]) -> tuple[list[int], list[int]]:
    """(prompt lengths, output lengths)."""
    return [len(r.prompt) for r in requests], [r.output_len for r in requests]
