"""Prompts of the speculative decoding benchmark, built from ../shared/data.

Two workloads:

* ``grounded``: input-grounded tasks whose answers quote their input, the
  case prompt lookup and suffix decoding serve (vLLM's n-gram measurements
  are on summarization): a text to copy with light edits, a passage to
  summarize quoting its key sentences, facts to extract verbatim, and code
  to edit (the Alpaca records' reference outputs are the material).
* ``chat``: plain ShareGPT-like chat, the conversations of
  ``dpo_en_demo.json`` (first user turn), where drafts are rarely accepted.

Every prompt is a chat message list (the model's chat template is applied by
the benchmark).
"""

from __future__ import annotations

import re
from typing import Any

from common import read_data

#: Instruction templates of the grounded workload; ``{text}`` is the material.
GROUNDED_TASKS = (
    "Copy the text below exactly, then add one sentence at the end saying what it is "
    "about.\n\nText:\n{text}",
    "Summarize the text below. Quote its two most important sentences word for word, "
    "then explain them.\n\nText:\n{text}",
    "Extract every sentence of the text below that contains a number or a name, "
    "verbatim, one per line.\n\nText:\n{text}",
)
CODE_TASK = (
    "Edit the code below: rename its variables to longer descriptive names and add a "
    "comment line above each line. Return the whole edited code.\n\n```\n{text}\n```"
)
_CODE = re.compile(r"^\s*(def |function |class |#include|SELECT |for \(|import |int main)", re.M)


def grounded_prompts(
    n: int, min_chars: int = 200, max_chars: int = 900
) -> list[list[dict[str, Any]]]:
    """``n`` input-grounded chat prompts (fewer if the data has fewer): the
    Alpaca records' reference outputs of ``min_chars`` to ``max_chars``
    characters, code ones under the code-edit task, the others under the
    copy / summary / extraction tasks in turn."""
    records = read_data("alpaca_en_demo.json")
    out: list[list[dict[str, Any]]] = []
    i = 0
    for r in records:
        text = r["output"].strip()
        if not min_chars <= len(text) <= max_chars:
            continue
        if _CODE.search(text):
            content = CODE_TASK.format(text=text)
        else:
            content = GROUNDED_TASKS[i % len(GROUNDED_TASKS)].format(text=text)
            i += 1
        out.append([{"role": "user", "content": content}])
        if len(out) == n:
            break
    return out


def chat_prompts(n: int, max_chars: int = 1500) -> list[list[dict[str, Any]]]:
    """``n`` ShareGPT-like chat prompts: the first user turn of each
    conversation of ``dpo_en_demo.json`` up to ``max_chars`` characters."""
    out: list[list[dict[str, Any]]] = []
    for r in read_data("dpo_en_demo.json"):
        first = next((c["value"] for c in r["conversations"] if c["from"] == "human"), None)
        if first and len(first) <= max_chars:
            out.append([{"role": "user", "content": first}])
        if len(out) == n:
            break
    return out


WORKLOADS = {"grounded": grounded_prompts, "chat": chat_prompts}
