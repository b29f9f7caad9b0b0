"""Traces the planner replays: requests with prompt tokens, an output length
and an arrival time.

Its sources are modules of their own: :mod:`.dataset_trace` (the data folder,
``sharegpt`` / ``alpaca``), :mod:`.chat_trace`, :mod:`.jsonl_trace`;
:func:`.trace_sources.load_trace` picks one by name.
"""

from __future__ import annotations

import math
import random
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

__all__ = ["Trace", "TraceRequest", "lengths", "synth_ids"]

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


def synth_ids(n: int, key: str) -> np.ndarray:
    """``n`` token ids drawn from a generator seeded by ``key`` (the same
    ids for the same key in every process): int64 ``[n]``."""
    rng = np.random.default_rng(zlib.crc32(key.encode()))
    return rng.integers(*_SYNTH_VOCAB, size=n, dtype=np.int64)


def lengths(requests: Sequence[TraceRequest]) -> tuple[list[int], list[int]]:
    """(prompt lengths, output lengths)."""
    return [len(r.prompt) for r in requests], [r.output_len for r in requests]
