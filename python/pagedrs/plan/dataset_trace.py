"""The ``sharegpt`` and ``alpaca`` traces: the ShareGPT-like and Alpaca-like
records of the benchmark data folder (``$PAGEDRS_DATA``, else
``../shared/data`` beside the checkout or the working directory). A request's
prompt is the conversation (or instruction + input) under the tokenizer's chat
template; its output length is the token length of the recorded answer."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from .trace import Trace, TraceRequest

__all__ = ["chat_ids", "data_dir", "dataset_trace", "load_tokenizer", "read_data"]


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


def chat_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of ``messages`` under the tokenizer's chat template (joined
    by blank lines when it has none)."""
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return list(tokenizer(text, add_special_tokens=False).input_ids)
    text = "\n\n".join(m["content"] for m in messages)
    return list(tokenizer(text).input_ids)


def load_tokenizer(tokenizer: Any) -> Any:
    """A transformers tokenizer: ``tokenizer`` itself, or loaded by model name
    (None: the engine's default model)."""
    if tokenizer is None or isinstance(tokenizer, str):
        from transformers import AutoTokenizer

        from ..executor.model_loader import hf_folder
        from ..executor.model_registry import DEFAULT_MODEL

        return AutoTokenizer.from_pretrained(hf_folder(tokenizer or DEFAULT_MODEL))
    return tokenizer


def read_data(name: str) -> Any:
    """The parsed JSON file ``name`` of the data folder."""
    path = data_dir() / name
    return json.loads(path.read_text())


def dataset_trace(
    name: str, tok: Any, num_requests: int | None, max_prompt_len: int, max_output_len: int
) -> Trace:
    """The ``sharegpt`` or ``alpaca`` trace: records with prompts over
    ``max_prompt_len`` tokens skipped, outputs capped at ``max_output_len``,
    the first ``num_requests`` kept (None: all).

    Raises:
        ValueError: the data folder is missing.
    """
    reqs: list[TraceRequest] = []
    if name == "alpaca":
        for r in read_data("alpaca_en_demo.json"):
            text = r["instruction"] + (("\n\n" + r["input"]) if r.get("input") else "")
            out = len(tok(r["output"], add_special_tokens=False).input_ids)
            reqs.append(_req(tok, [{"role": "user", "content": text}], out))
    else:
        roles = {"human": "user", "gpt": "assistant", "system": "system"}
        for r in read_data("dpo_en_demo.json"):
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
    return TraceRequest(np.asarray(chat_ids(tok, messages), dtype=np.int64), output_len)
