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
"""

from __future__ import annotations

import json
import math
import os
import random
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["Trace", "TraceRequest", "data_dir", "load_trace", "read_jsonl_trace"]

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


def data_dir() -> Path:
    """The benchmark data folder: ``$PAGEDRS_DATA``, else ``shared/data``
    beside the checkout, else beside the working directory.

    Raises:
        ValueError: none holds the files, naming where to get them.
    """
    env = os.environ.get("PAGEDRS_DATA")
    candidates = [Path(env)] if env else []
    candidates += [
        Path(__file__).resolve().parents[4] / "shared" / "data",
        Path(__file__).resolve().parents[3].parent / "shared" / "data",
        Path.cwd().parent / "shared" / "data",
        Path.cwd() / "shared" / "data",
    ]
    for c in candidates:
        if (c / "alpaca_en_demo.json").exists():
            return c
    raise ValueError(
        "trace data not found (looked in "
        + ", ".join(str(c) for c in candidates)
        + "): set PAGEDRS_DATA to a folder holding alpaca_en_demo.json and dpo_en_demo.json "
        "(the data/ folder of the llamafactory 0.9.5 sdist)"
    )


def _synth_ids(n: int, key: str) -> np.ndarray:
    rng = np.random.default_rng(zlib.crc32(key.encode()))
    return rng.integers(*_SYNTH_VOCAB, size=n, dtype=np.int64)


def _chat_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return list(tokenizer(text, add_special_tokens=False).input_ids)
    text = "\n\n".join(m["content"] for m in messages)
    return list(tokenizer(text).input_ids)


def _load_tokenizer(tokenizer: Any) -> Any:
    if tokenizer is None or isinstance(tokenizer, str):
        from transformers import AutoTokenizer

        from ..executor.model_loader import resolve_model
        from ..executor.model_registry import DEFAULT_MODEL

        folder, _ = resolve_model(tokenizer or DEFAULT_MODEL)
        return AutoTokenizer.from_pretrained(folder)
    return tokenizer


def _read(name: str) -> Any:
    path = data_dir() / name
    return json.loads(path.read_text())


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
    tok = _load_tokenizer(tokenizer)
    if name == "chat":
        return _chat_trace(tok, sessions, turns, system_prompts, system_len, reply_len, think_s)
    reqs: list[TraceRequest] = []
    if name == "alpaca":
        for r in _read("alpaca_en_demo.json"):
            text = r["instruction"] + (("\n\n" + r["input"]) if r.get("input") else "")
            out = len(tok(r["output"], add_special_tokens=False).input_ids)
            reqs.append(_req(tok, [{"role": "user", "content": text}], out))
    else:
        roles = {"human": "user", "gpt": "assistant", "system": "system"}
        for r in _read("dpo_en_demo.json"):
            msgs = [
                {"role": roles.get(c["from"], "user"), "content": c["value"]}
                for c in r["conversations"]
            ]
            out = len(tok(r["chosen"]["value"], add_special_tokens=False).input_ids)
            reqs.append(_req(tok, msgs, out))
    kept = [
        replace(r, output_len=min(r.output_len, max_output_len))
        for r in reqs
        if len(r.prompt) <= max_prompt_len and r.output_len >= 1
    ]
    if num_requests:
        kept = kept[:num_requests]
    return Trace(name, kept, False)


def _req(tok: Any, messages: list[dict[str, str]], output_len: int) -> TraceRequest:
    return TraceRequest(np.asarray(_chat_ids(tok, messages), dtype=np.int64), output_len)


def _chat_trace(
    tok: Any,
    sessions: int,
    turns: int,
    system_prompts: int,
    system_len: int,
    reply_len: int,
    think_s: float,
    base_sessions: int = 256,
) -> Trace:
    """Sessions over shared system prompts; each session's first user message
    carries its own tag, so sessions share the system prompt only. A turn's
    prompt is the last turn's prompt and reply plus the new user message,
    token for token (the template's text after the earlier turns is
    tokenized alone), so a turn's prompt starts with the whole history."""
    dpo = _read("dpo_en_demo.json")
    alpaca = _read("alpaca_en_demo.json")
    answers = sorted((r["chosen"]["value"] for r in dpo), key=len, reverse=True)
    systems = []
    for text in answers[:system_prompts]:
        ids = tok(text, add_special_tokens=False).input_ids[:system_len]
        head = "You are a helpful assistant. Answer like this reference.\n\n"
        systems.append(head + tok.decode(ids))
    templated = bool(getattr(tok, "chat_template", None))

    def render(msgs: list[dict[str, str]], gen: bool) -> str:
        if templated:
            return str(tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen))
        text = "\n\n".join(m["content"] for m in msgs)
        return text + ("\n\n" if gen else "")

    def ids_of(text: str) -> list[int]:
        return list(tok(text, add_special_tokens=False).input_ids)

    reqs: list[TraceRequest] = []
    shared_lens: list[int] = []
    base = min(sessions, base_sessions)
    for s in range(base):
        msgs = [{"role": "system", "content": systems[s % len(systems)]}]
        sys_text = render(msgs, False)
        prev: int | None = None
        full_text: str = ""
        full_ids: list[int] = []
        for k in range(turns):
            r = alpaca[(s * turns + k) % len(alpaca)]
            user = r["instruction"] + (("\n\n" + r["input"]) if r.get("input") else "")
            if k == 0:
                user = f"(user {s}) {user}"
            msgs = msgs + [{"role": "user", "content": user}]
            p_text = render(msgs, True)
            if full_text and p_text.startswith(full_text):
                prompt = full_ids + ids_of(p_text[len(full_text) :])
            elif p_text.startswith(sys_text):
                prompt = ids_of(sys_text) + ids_of(p_text[len(sys_text) :])
            else:
                prompt = ids_of(p_text)
            shared = len(ids_of(sys_text)) if p_text.startswith(sys_text) else 0
            reply = tok.decode(ids_of(r["output"])[:reply_len]) or "."
            msgs = msgs + [{"role": "assistant", "content": reply}]
            f_text = render(msgs, False)
            if f_text.startswith(p_text):
                gen = ids_of(f_text[len(p_text) :])
            else:
                gen = ids_of(reply)
            gen = gen or ids_of(".")
            reqs.append(
                TraceRequest(
                    np.asarray(prompt, dtype=np.int64),
                    len(gen),
                    output_ids=np.asarray(gen, dtype=np.int64),
                    follows=prev,
                    think_s=think_s if prev is not None else 0.0,
                    session=f"s{s}",
                )
            )
            shared_lens.append(shared)
            prev = len(reqs) - 1
            full_text, full_ids = f_text, prompt + gen
    # Sessions past ``base_sessions`` repeat a built one's turns with a tag of
    # their own (synthetic tokens right after the system prompt).
    per = len(reqs) // base if base else 0
    for s in range(base, sessions):
        b = s % base
        tag = _synth_ids(4, f"session:{s}")
        first = len(reqs)
        for k in range(per):
            src = reqs[b * per + k]
            cut = shared_lens[b * per + k]
            prompt_ids = np.concatenate([src.prompt[:cut], tag, src.prompt[cut:]])
            reqs.append(
                replace(
                    src,
                    prompt=prompt_ids,
                    follows=None if src.follows is None else first + k - 1,
                    session=f"s{s}",
                )
            )
    meta = {"sessions": sessions, "turns": turns, "system_prompts": system_prompts}
    return Trace("chat", reqs, False, meta)


def read_jsonl_trace(path: str | Path) -> Trace:
    """A JSONL trace (see the module docstring).

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
                        _synth_ids(plen_prefix, f"group:{group}"),
                        _synth_ids(plen - plen_prefix, f"line:{n}"),
                    ]
                )
            else:
                prompt = _synth_ids(plen, f"line:{n}")
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


def lengths(requests: Sequence[TraceRequest]) -> tuple[list[int], list[int]]:
    """(prompt lengths, output lengths)."""
    return [len(r.prompt) for r in requests], [r.output_len for r in requests]
