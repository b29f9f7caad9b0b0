"""JSONL traces, one request a line: ``output_len`` and either ``prompt_len``
(synthetic token ids) or ``prompt_token_ids``; optional ``arrival_s`` (s from
the start, on every line or on none), ``prefix_group`` with ``prefix_len``
(requests of one group share their first ``prefix_len`` prompt tokens)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from .trace import Trace, TraceRequest, synth_ids

__all__ = ["read_jsonl_trace"]


def read_jsonl_trace(path: str | Path) -> Trace:
    """A JSONL trace (the format: this module's docstring).

    Raises:
        ValueError: a line that is not a JSON object, a missing or invalid
            field, or a prefix longer than the prompt, naming the file and line.
    """
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise ValueError(f"trace {path}: {e.strerror}") from e
    reqs: list[TraceRequest] = []
    timed: bool | None = None
    last_t = 0.0
    known = {
        "prompt_len",
        "prompt_token_ids",
        "output_len",
        "arrival_s",
        "prefix_group",
        "prefix_len",
    }
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"trace {path} line {n}"
        try:
            d = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: not JSON ({e.msg})") from e
        if not isinstance(d, dict):
            raise ValueError(f"{where}: a request is a JSON object")
        extra = sorted(set(d) - known)
        if extra:
            raise ValueError(f"{where}: unknown field {extra[0]!r} (fields: {sorted(known)})")
        out = _pos_int(d, "output_len", where)
        if "prompt_token_ids" in d:
            ids = d["prompt_token_ids"]
            if not isinstance(ids, list) or not ids or not all(_is_token(i) for i in ids):
                raise ValueError(
                    f"{where}: field 'prompt_token_ids' must be a non-empty list of token ids"
                )
            prompt = np.asarray(ids, dtype=np.int64)
        elif "prompt_len" in d:
            plen = _pos_int(d, "prompt_len", where)
            group = d.get("prefix_group")
            if group is not None:
                plen_prefix = _pos_int(d, "prefix_len", where)
                if plen_prefix > plen:
                    raise ValueError(
                        f"{where}: field 'prefix_len' ({plen_prefix}) exceeds 'prompt_len' ({plen})"
                    )
                prompt = np.concatenate(
                    [
                        synth_ids(plen_prefix, f"group:{group}"),
                        synth_ids(plen - plen_prefix, f"line:{n}"),
                    ]
                )
            else:
                prompt = synth_ids(plen, f"line:{n}")
        else:
            raise ValueError(f"{where}: missing field 'prompt_len' (or 'prompt_token_ids')")
        has_t = "arrival_s" in d
        if timed is None:
            timed = has_t
        elif timed != has_t:
            raise ValueError(f"{where}: field 'arrival_s' must be on every line or on none")
        t = 0.0
        if has_t:
            v = d["arrival_s"]
            if (
                isinstance(v, bool)
                or not isinstance(v, (int, float))
                or not v >= 0
                or v == math.inf
            ):
                raise ValueError(f"{where}: field 'arrival_s' must be a number >= 0, got {v!r}")
            t = float(v)
            if t < last_t:
                raise ValueError(
                    f"{where}: field 'arrival_s' ({t}) is earlier than the line before ({last_t})"
                )
            last_t = t
        reqs.append(TraceRequest(prompt, out, t, session=d.get("prefix_group")))
    if not reqs:
        raise ValueError(f"trace {path}: no requests")
    return Trace(path.stem, reqs, bool(timed))


def _is_token(i: Any) -> bool:
    return isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 2**32


def _pos_int(d: dict[str, Any], key: str, where: str) -> int:
    if key not in d:
        raise ValueError(f"{where}: missing field {key!r}")
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{where}: field {key!r} must be a positive integer, got {v!r}")
    return int(v)
