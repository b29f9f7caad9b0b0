"""Shared helpers of the benchmarks: request data from ../shared/data, output tables."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DATA_DIR = Path(
    os.environ.get("PAGEDRS_DATA", Path(__file__).resolve().parents[2] / "shared" / "data")
)


def read_data(name: str) -> Any:
    """The JSON records of ``name`` in the data folder (``$PAGEDRS_DATA``, default
    ``../shared/data`` beside the checkout).

    Raises:
        SystemExit: with how to get the files, when the folder lacks them.
    """
    path = DATA_DIR / name
    if not path.exists():
        raise SystemExit(
            f"benchmark data {path} not found: set PAGEDRS_DATA to a folder holding "
            "alpaca_en_demo.json and dpo_en_demo.json (the data/ folder of the llamafactory "
            "0.9.5 sdist: pip download --no-deps --no-binary :all: llamafactory==0.9.5)"
        )
    return json.loads(path.read_text())


def alpaca_prompts(n: int) -> list[str]:
    """The first ``n`` Alpaca-like instructions (instruction + input), as user messages."""
    records = read_data("alpaca_en_demo.json")
    out = []
    for r in records[:n]:
        text = r["instruction"] + (("\n\n" + r["input"]) if r.get("input") else "")
        out.append(text)
    return out


def print_table(title: str, header: list[str], rows: list[list[Any]]) -> None:
    """A fixed-width table on stdout."""
    cells = [[str(c) for c in header]] + [
        [f"{c:.2f}" if isinstance(c, float) else str(c) for c in r] for r in rows
    ]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    print(f"\n{title}")
    for i, r in enumerate(cells):
        print("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))
        if i == 0:
            print("  ".join("-" * w for w in widths))


@dataclass
class TraceRequest:
    """One request of a trace: chat messages and the reference output length (tokens)."""

    messages: list[dict[str, str]]
    output_len: int


def load_trace(
    dataset: str, tokenizer: Any, max_output: int, max_prompt: int
) -> list[TraceRequest]:
    """Every usable record of a data set in ../shared/data, in file order.

    ``alpaca``: instruction (+ input) as the user message, the reference output's
    length as the output length. ``sharegpt``: the conversation as messages, the
    ``chosen`` reply's length as the output length. Records with prompts over
    ``max_prompt`` tokens or outputs under 4 tokens are skipped; outputs are
    capped at ``max_output`` tokens.

    Raises:
        ValueError: unknown data set.
    """
    reqs = []
    if dataset == "alpaca":
        for r in read_data("alpaca_en_demo.json"):
            text = r["instruction"] + (("\n\n" + r["input"]) if r.get("input") else "")
            out = len(tokenizer(r["output"]).input_ids)
            reqs.append(TraceRequest([{"role": "user", "content": text}], out))
    elif dataset == "sharegpt":
        roles = {"human": "user", "gpt": "assistant", "system": "system"}
        for r in read_data("dpo_en_demo.json"):
            msgs = [
                {"role": roles.get(c["from"], "user"), "content": c["value"]}
                for c in r["conversations"]
            ]
            out = len(tokenizer(r["chosen"]["value"]).input_ids)
            reqs.append(TraceRequest(msgs, out))
    else:
        raise ValueError(f"unknown dataset {dataset!r}: alpaca or sharegpt")
    trace = []
    for req in reqs:
        n_prompt = sum(len(tokenizer(m["content"]).input_ids) for m in req.messages)
        if n_prompt <= max_prompt and req.output_len >= 4:
            trace.append(TraceRequest(req.messages, min(req.output_len, max_output)))
    return trace


def chat_prompt_ids(
    tokenizer: Any, messages: list[dict[str, str]], chat_template: str | None = None
) -> list[int]:
    """Token ids of ``messages`` under the tokenizer's chat template, or the Jinja
    ``chat_template`` given (generation prompt added)."""
    text = tokenizer.apply_chat_template(
        messages, chat_template=chat_template, tokenize=False, add_generation_prompt=True
    )
    return list(tokenizer(text, add_special_tokens=False).input_ids)


def poisson_arrivals(n: int, rate: float, seed: int) -> list[float]:
    """Arrival times (s, from 0) of ``n`` requests of a Poisson process at ``rate`` req/s.

    The first request arrives at 0; ``rate`` = inf puts every request at 0.
    """
    import random

    if not math.isfinite(rate):
        return [0.0] * n
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


def json_safe(x: Any) -> Any:
    """``x`` with non-finite floats as strict JSON allows: inf -> "inf", NaN -> None."""
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None if math.isnan(x) else ("inf" if x > 0 else "-inf")
    return x


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), or the platform's processor string."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or "unknown CPU"
