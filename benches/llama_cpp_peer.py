"""llama.cpp as a batched offline peer, through ``llama-cpp-python``'s bindings of
llama.cpp's own batch API.

The high-level ``llama_cpp.Llama`` decodes one sequence per call. This peer drives
llama.cpp the way its ``parallel`` example and its server do: every request gets a
sequence id (a slot) of one context, and each ``llama_decode`` call carries one
``llama_batch`` holding the next token of every decoding request plus as many prompt
tokens of newly admitted requests as fit in ``n_batch`` (continuous batching). Each
slot's KV cells are its own stream (``kv_unified=False``) of ``n_ctx / n_seq_max``
cells; a finished request's cells are dropped with ``llama_memory_seq_rm`` and its slot
takes the next waiting request. Greedy: the argmax of each returned logits row.
"""

from __future__ import annotations

import ctypes
import functools
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

#: A request: prompt token ids and its output length (None: up to max_tokens, EOS stops).
Request = tuple[list[int], int | None]


#: GGML type ids of the KV cache types offered (llama.cpp's ``ggml_type``).
CACHE_TYPES = {"f16": 1, "q8_0": 8}


def _ignore_log(level: int, text: bytes, user_data: object) -> None:
    """llama.cpp's log callback: its load and graph logs are dropped."""


@functools.cache
def _quiet() -> object:
    """The ctypes callback of ``_ignore_log``, made once and kept alive (llama.cpp
    holds its pointer)."""
    import llama_cpp as lc

    return lc.llama_log_callback(_ignore_log)


@dataclass
class _Slot:
    """One sequence id of the context and the request it serves."""

    prompt: list[int]
    want: int
    stop_at_eos: bool
    out: list[int]  # the request's output token ids, appended in place
    fed: int = 0  # prompt tokens already in the KV cache


def available() -> bool:
    """Whether ``llama-cpp-python`` is importable."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


def run_batched(
    model_path: Path,
    reqs: list[Request],
    max_tokens: int,
    threads: int,
    parallel: int = 16,
    n_batch: int = 2048,
    flash_attn: bool | None = None,
    cache_type: str = "f16",
    unified: bool = False,
    stats: dict[str, float] | None = None,
) -> tuple[float, list[list[int]]]:
    """Greedy-decode ``reqs`` with llama.cpp, up to ``parallel`` at once.

    Returns (seconds, each request's output token ids), timed from the first
    ``llama_decode`` call to the last request's end (model and context creation
    excluded, as for the other engines).

    ``n_batch`` bounds the tokens of one ``llama_decode`` call (llama.cpp splits it
    into micro-batches of 512). ``flash_attn``: llama.cpp's flash attention on, off,
    or None for llama.cpp's own choice (on where the backend supports it).
    ``cache_type``: the KV cache's GGML type (``--cache-type-k/-v``), ``f16`` or
    ``q8_0`` (needs flash attention). ``unified``: one pool of KV cells shared by all
    sequences (``--kv-unified``) instead of one stream per sequence. ``stats``, when
    given, receives ``cpu_seconds``: the process's CPU time (user + system, all
    threads) over the same window as the returned seconds, model load excluded.

    Raises:
        RuntimeError: llama.cpp could not load the model, create the context or
            decode a batch.
    """
    import llama_cpp as lc

    lc.llama_backend_init()
    lc.llama_log_set(_quiet(), None)
    model = lc.llama_model_load_from_file(str(model_path).encode(), lc.llama_model_default_params())
    if not model:
        raise RuntimeError(f"llama.cpp could not load {model_path}")
    n_seq = max(1, min(parallel, len(reqs)))
    lengths = sorted((len(p) + (n or max_tokens) for p, n in reqs), reverse=True)
    cp = lc.llama_context_default_params()
    if unified:  # one pool of cells: room for the n_seq longest requests at once
        cp.n_ctx = -(-sum(lengths[:n_seq]) // 256) * 256
    else:  # n_seq streams of n_ctx / n_seq cells, each room for the longest request
        cp.n_ctx = -(-lengths[0] // 256) * 256 * n_seq
    cp.n_batch = n_batch
    cp.n_ubatch = 512
    cp.n_seq_max = n_seq
    cp.n_threads = threads
    cp.n_threads_batch = threads
    cp.kv_unified = unified
    if flash_attn is not None:
        cp.flash_attn_type = (
            lc.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn else lc.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
    cp.type_k = cp.type_v = CACHE_TYPES[cache_type]
    ctx = lc.llama_init_from_model(model, cp)
    if not ctx:
        lc.llama_model_free(model)
        raise RuntimeError(f"llama.cpp could not create a context of {cp.n_ctx} cells")
    vocab = lc.llama_model_get_vocab(model)
    n_vocab = lc.llama_vocab_n_tokens(vocab)
    eos = lc.llama_vocab_eos(vocab)
    memory = lc.llama_get_memory(ctx)
    batch = lc.llama_batch_init(n_batch, 0, 1)
    try:
        c0, t0 = time.process_time(), time.perf_counter()
        outs = _decode_all(lc, ctx, memory, batch, reqs, max_tokens, n_seq, n_batch, n_vocab, eos)
        dt = time.perf_counter() - t0
        if stats is not None:
            stats["cpu_seconds"] = time.process_time() - c0
        return dt, outs
    finally:
        lc.llama_batch_free(batch)
        lc.llama_free(ctx)
        lc.llama_model_free(model)


def _decode_all(
    lc: object,
    ctx: object,
    memory: object,
    batch: object,
    reqs: list[Request],
    max_tokens: int,
    n_seq: int,
    n_batch: int,
    n_vocab: int,
    eos: int,
) -> list[list[int]]:
    """The continuous-batching loop; returns each request's output token ids."""
    slots: list[_Slot | None] = [None] * n_seq
    waiting = list(range(len(reqs)))[::-1]
    outs: list[list[int]] = [[] for _ in reqs]
    while True:
        for s in range(n_seq):
            if slots[s] is None and waiting:
                i = waiting.pop()
                prompt, n = reqs[i]
                slots[s] = _Slot(prompt, n or max_tokens, n is None, outs[i])
        if all(slot is None for slot in slots):
            return outs
        # (token, position, slot, logits wanted) of each batch row: decodes first,
        # one token each, then prompt chunks of admitted requests, as many as fit
        entries: list[tuple[int, int, int, bool]] = []
        for s, slot in enumerate(slots):
            if slot is not None and slot.fed == len(slot.prompt):
                entries.append((slot.out[-1], len(slot.prompt) + len(slot.out) - 1, s, True))
        for s, slot in enumerate(slots):
            if slot is None or slot.fed == len(slot.prompt) or len(entries) == n_batch:
                continue
            take = min(len(slot.prompt) - slot.fed, n_batch - len(entries))
            last = len(slot.prompt) - 1
            entries += [(slot.prompt[j], j, s, j == last) for j in range(slot.fed, slot.fed + take)]
            slot.fed += take
        outputs = _fill(batch, entries)
        rc = lc.llama_decode(ctx, batch)  # type: ignore[attr-defined]
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc} for a batch of {len(entries)} tokens")
        for row, s in outputs:
            ptr = lc.llama_get_logits_ith(ctx, row)  # type: ignore[attr-defined]
            row_logits = ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float))
            token = int(np.ctypeslib.as_array(row_logits, (n_vocab,)).argmax())
            slot = slots[s]
            assert slot is not None
            slot.out.append(token)
            if len(slot.out) >= slot.want or (slot.stop_at_eos and token == eos):
                lc.llama_memory_seq_rm(memory, s, -1, -1)  # type: ignore[attr-defined]
                slots[s] = None


def _fill(batch: object, entries: list[tuple[int, int, int, bool]]) -> list[tuple[int, int]]:
    """Write ``entries`` (token, position, sequence id, logits wanted) into the
    ``llama_batch``; returns (row, sequence id) of each row whose logits come back."""
    outputs = []
    for row, (token, pos, seq, logits) in enumerate(entries):
        batch.token[row] = token  # type: ignore[attr-defined]
        batch.pos[row] = pos  # type: ignore[attr-defined]
        batch.n_seq_id[row] = 1  # type: ignore[attr-defined]
        batch.seq_id[row][0] = seq  # type: ignore[attr-defined]
        batch.logits[row] = 1 if logits else 0  # type: ignore[attr-defined]
        if logits:
            outputs.append((row, seq))
    batch.n_tokens = len(entries)  # type: ignore[attr-defined]
    return outputs
