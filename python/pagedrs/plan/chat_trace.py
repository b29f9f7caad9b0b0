"""The ``chat`` trace: multi-turn chat sessions over shared system prompts
(the ShareGPT-like answers as system prompts, Alpaca-like instructions as user
turns, their answers as the assistant's replies). Turn ``k`` sends the system
prompt and the whole history and arrives ``think_s`` after turn ``k - 1``
finishes, so prefixes repeat as in a chat service."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from .dataset_trace import read_data
from .trace import Trace, TraceRequest, synth_ids

__all__ = ["chat_trace"]


def chat_trace(
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
    dpo = read_data("dpo_en_demo.json")
    alpaca = read_data("alpaca_en_demo.json")
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
        tag = synth_ids(4, f"session:{s}")
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
