"""Per-sequence grammar matchers: the step's bitmask, filled on a worker thread
while the forward runs, and each sampled token accepted after the step."""

from __future__ import annotations

import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch
import xgrammar as xgr

from .._core import StepBatch
from ..sampling_params import StructuredOutputsParams
from .bitmask import StepBitmask
from .compiler import GrammarCompilerCache
from .spec import GrammarSpec


class GrammarRejectedError(RuntimeError):
    """A sampled token is outside its sequence's grammar (its mask was not applied)."""


class StructuredOutputManager:
    """The grammar matchers of live sequences, one per sequence (``n`` /
    ``best_of`` sequences each have their own), keyed by the scheduler's
    sequence id.

    A matcher's state is the sequence's generated tokens, so preemption (by
    recompute or swap) leaves it valid. Used by the engine's thread; the bitmask
    fill runs on one worker thread (xgrammar releases the GIL while filling).

    Args:
        compiler: compiled grammars over the engine's vocabulary.
        fill_threads: threads xgrammar uses inside one batched fill (default:
            half the cores, at most 8: the forward runs meanwhile).
    """

    def __init__(self, compiler: GrammarCompilerCache, fill_threads: int | None = None) -> None:
        self.compiler = compiler
        self._fill_threads = fill_threads or max(1, min(8, (os.cpu_count() or 2) // 2))
        self._matchers: dict[int, xgr.GrammarMatcher] = {}
        self._group: dict[int, list[int]] = {}  # first sequence id -> all of the request's
        self._jump: set[int] = set()  # sequences with jump-forward decoding
        self._pool: ThreadPoolExecutor | None = None
        self._batch: xgr.BatchGrammarMatcher | None = None
        self.num_fills = 0
        self.rows_filled = 0
        self.fill_s = 0.0
        self.wait_s = 0.0
        self.num_draft_rows = 0
        self.num_drafts_refused = 0

    def compile(self, params: StructuredOutputsParams) -> xgr.CompiledGrammar:
        """Compile (or fetch from the cache) the grammar of ``params``.

        Raises:
            ValueError: an invalid schema, regex or grammar.
        """
        return self.compiler.compile(GrammarSpec.from_params(params))

    def add(
        self, seq_ids: list[int], compiled: xgr.CompiledGrammar, jump_forward: bool = False
    ) -> None:
        """Give each of a request's sequences (first one first) its own matcher
        (``jump_forward``: their forced text is asked for, ``forced_text``)."""
        for sid in seq_ids:
            self._matchers[sid] = xgr.GrammarMatcher(compiled)
            if jump_forward:
                self._jump.add(sid)
        self._group[seq_ids[0]] = list(seq_ids)

    def forced_text(self, seq_id: int) -> tuple[str, bool] | None:
        """The text ``seq_id``'s grammar forces next (jump-forward decoding),
        and whether only stop tokens can follow it; None when the sequence
        did not ask for jumps, has no matcher, or the grammar forces nothing."""
        m = self._matchers.get(seq_id) if seq_id in self._jump else None
        if m is None or m.is_terminated():
            return None
        text = m.find_jump_forward_string()
        if not text:
            return None
        after = m.fork()
        if not after.accept_string(text):
            return None
        mask = xgr.allocate_token_bitmask(1, self.compiler.vocab_size)
        after.fill_next_token_bitmask(mask)
        bits = (mask[0].view(-1, 1) >> torch.arange(32, dtype=torch.int32)) & 1
        allowed = torch.nonzero(bits.flatten()).flatten()[: len(after.stop_token_ids) + 1]
        ends = 0 < len(allowed) <= len(after.stop_token_ids) and set(allowed.tolist()) <= set(
            after.stop_token_ids
        )
        return text, ends

    def replace_last(self, seq_id: int, token: int, tokens: list[int], rollback: int = 1) -> bool:
        """Advance ``seq_id``'s matcher with ``tokens`` in place of its last
        ``rollback`` accepted tokens (the last one ``token``); False (nothing
        changed) when the grammar refuses one of them."""
        m = self._matchers[seq_id]
        m.rollback(rollback)
        for n, t in enumerate(tokens):
            if not m.accept_token(t):
                if n:
                    m.rollback(n)
                m.accept_token(token)
                return False
        return True

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self._matchers

    def __len__(self) -> int:
        """Live matchers."""
        return len(self._matchers)

    @property
    def num_jumping(self) -> int:
        """Live sequences with jump-forward decoding."""
        return len(self._jump)

    def start_fill(self, batch: StepBatch) -> Future[StepBitmask] | None:
        """Start filling the bitmask of the step's grammar samples on the worker
        thread; None when no sample of the step has a grammar.

        A row samples ``num_samples`` tokens: one for its own sequence, or, at
        a group's first sample, one for each of the request's sequences. In a
        step with drafts (``batch.num_drafts > 0``) the bitmask covers the
        verify step's position rows (``spec_decode.VerifyPlan``): a row with
        ``d`` drafts has ``d + 1`` samples, the j-th allowing the tokens the
        grammar allows after the row's verified tokens and its first ``j``
        drafts (see ``_fill_drafted``).
        """
        rows: list[int] = []
        matchers: list[xgr.GrammarMatcher] = []
        drafted: list[tuple[xgr.GrammarMatcher, int, list[int]]] = []
        nd = batch.num_draft_tokens.tolist() if batch.num_drafts else None
        flat = batch.draft_token_ids.tolist() if nd is not None else []
        k = at = 0
        for r, (sid, ns) in enumerate(
            zip(batch.sample_request_ids.tolist(), batch.num_samples.tolist(), strict=True)
        ):
            d = nd[r] if nd is not None else 0
            if d:  # a drafted row samples once per position (its own sequence)
                m = self._matchers.get(sid)
                if m is not None:
                    drafted.append((m, k, flat[at : at + d]))
                k, at = k + d + 1, at + d
                continue
            seq_ids = [sid] if ns == 1 else self._group.get(sid, [])[:ns]
            for j, seq in enumerate(seq_ids):
                m = self._matchers.get(seq)
                if m is not None:
                    rows.append(k + j)
                    matchers.append(m)
            k += ns
        if not rows and not drafted:
            return None
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="pagedrs-grammar")
            self._batch = xgr.BatchGrammarMatcher(max_threads=self._fill_threads)
        return self._pool.submit(self._fill, k, rows, matchers, drafted)

    def _fill(
        self,
        num_rows: int,
        rows: list[int],
        matchers: list[Any],
        drafted: list[tuple[Any, int, list[int]]],
    ) -> StepBitmask:
        """Worker thread: allocate the all-ones ``[num_rows, W]`` bitmask, fill
        ``rows`` in one batched call, then each drafted row's positions."""
        t0 = time.perf_counter()
        vocab = self.compiler.vocab_size
        bitmask = xgr.allocate_token_bitmask(num_rows, vocab)
        if rows:
            assert self._batch is not None
            self._batch.batch_fill_next_token_bitmask(matchers, bitmask, indices=rows)
        filled = list(rows)
        for m, first, drafts in drafted:
            own, refused = _fill_drafted(m, bitmask, first, drafts)
            filled.extend(own)
            self.num_draft_rows += 1
            self.num_drafts_refused += int(refused)
        filled.sort()
        return StepBitmask(bitmask, filled, vocab, time.perf_counter() - t0)

    def finish_fill(self, fill: Future[StepBitmask]) -> StepBitmask:
        """Wait for a fill started by ``start_fill``; counts fill and wait time.

        Raises:
            whatever the fill raised.
        """
        t0 = time.perf_counter()
        mask = fill.result()
        self.wait_s += time.perf_counter() - t0
        self.fill_s += mask.fill_s
        self.num_fills += 1
        self.rows_filled += len(mask.rows)
        return mask

    def accept(self, seq_id: int, token: int) -> bool:
        """Advance ``seq_id``'s matcher (if it has one) with its sampled token.

        Returns:
            True when the grammar is complete (the matcher accepted a stop
            token): the sequence must end; its matcher is dropped.
        Raises:
            GrammarRejectedError: the token is outside the grammar.
        """
        m = self._matchers.get(seq_id)
        if m is None:
            return False
        if not m.accept_token(token):
            raise GrammarRejectedError(
                f"sequence {seq_id}: sampled token {token} is outside its grammar"
            )
        if m.is_terminated():
            del self._matchers[seq_id]
            self._jump.discard(seq_id)
            return True
        return False

    def release(self, seq_ids: list[int]) -> None:
        """Drop the matchers of a finished or aborted request's sequences."""
        if seq_ids:
            self._group.pop(seq_ids[0], None)
        for sid in seq_ids:
            self._matchers.pop(sid, None)
            self._jump.discard(sid)

    def stats(self) -> dict[str, float]:
        """Counters: live_matchers, num_fills (steps with a grammar sample),
        rows_filled (bitmask rows filled, draft positions included), draft_rows (drafted sequence
        steps checked against their grammar), drafts_refused (of those, the
        ones whose drafts the grammar refused from some position on), fill_s
        (seconds filling on the worker thread), wait_s (seconds the step
        waited for a fill after its forward), compiled (grammars cached),
        cache_hits, cache_misses."""
        return {
            "live_matchers": len(self._matchers),
            "num_fills": self.num_fills,
            "rows_filled": self.rows_filled,
            "draft_rows": self.num_draft_rows,
            "drafts_refused": self.num_drafts_refused,
            "fill_s": self.fill_s,
            "wait_s": self.wait_s,
            "compiled": len(self.compiler),
            "cache_hits": self.compiler.hits,
            "cache_misses": self.compiler.misses,
        }

    def close(self) -> None:
        """Stop the worker thread (idempotent)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


def _fill_drafted(
    m: Any, bitmask: torch.Tensor, first: int, drafts: list[int]
) -> tuple[list[int], bool]:
    """Fill the position rows of a drafted sequence from ``first``: row
    ``first + j`` allows what the grammar allows after the verified tokens and
    ``drafts[:j]``. The matcher takes the drafts one by one and is rolled back
    to the verified tokens at the end (``rollback``), so that only the tokens
    verification keeps advance it (``StructuredOutputManager.accept``).

    A draft the grammar refuses ends the draft there: its row is filled (the
    target's token at that position obeys the grammar), the rows after it
    stay all ones and out of the step's grammar rows. Verification never keeps
    such a draft: the target's token at its position is masked by the row, so
    it differs from the draft, and the run ends there with the target's token.
    After a draft that completes the grammar (a stop token) no row is filled:
    the sequence ends at that token.

    Returns:
        the rows filled, and whether the grammar refused a draft.
    """
    n = 0
    filled: list[int] = []
    refused = False
    for token in [*drafts, None]:
        if m.is_terminated():
            break
        m.fill_next_token_bitmask(bitmask, first + n)
        filled.append(first + n)
        if token is None:
            break
        if not m.accept_token(token):
            refused = True
            break
        n += 1
    if n:
        m.rollback(n)
    return filled, refused
