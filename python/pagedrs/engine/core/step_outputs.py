"""What a step yields in the engine core: the sampled tokens appended to their
sequences and collected as token-id deltas (logprob entries, grammar matchers
advanced), forced tokens of jump-forward decoding, prompt logprobs, and the
sampler's per-row extras. No text: the front end's output processor
detokenizes."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..._core import StepBatch
from ...executor.sampler import SamplerOutput, SamplingExtras
from ...spec_decode.verify import SampleRows, Verified
from ...structured_output import StructuredOutputManager
from ...structured_output.jump_forward import CONTEXT_TOKENS, CanonicalTokens
from .messages import LogprobEntry, RequestDelta, SequenceDelta
from .request_state import RequestState, SequenceState

Owner = dict[int, tuple[RequestState, SequenceState]]


def _padded(rows: list[list[int]]) -> np.ndarray:
    width = max((len(r) for r in rows), default=0)
    out = np.full((len(rows), max(width, 1)), -1, dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def build_extras(
    batch: StepBatch | SampleRows, owner: Owner, pending: list[list[int]] | None = None
) -> SamplingExtras | None:
    """Per-row sampler inputs the Rust arrays lack; None when no row needs any.

    Args:
        batch: the step batch, or a verify step's position rows.
        pending: per row of a verify step, the drafts before its position:
            penalties count them as output tokens (the row's token is used
            only when they are all accepted).
    """
    known = [owner.get(int(rid)) for rid in batch.sample_request_ids]
    if not any(o is not None and o[0].special for o in known):
        return None
    # Rows of other request kinds (beam search) get neutral settings.
    neutral = next(o for o in known if o is not None)
    states = [o if o is not None else neutral for o in known]
    params = [st.params for st, _ in states]
    n_out = batch.num_output_tokens
    penalties = any(p.needs_penalties for p in params)
    return SamplingExtras(
        min_p=np.array([p.min_p for p in params], dtype=np.float32),
        presence_penalty=np.array([p.presence_penalty for p in params], dtype=np.float32),
        frequency_penalty=np.array([p.frequency_penalty for p in params], dtype=np.float32),
        repetition_penalty=np.array([p.repetition_penalty for p in params], dtype=np.float32),
        output_ids=(
            _padded(
                [
                    seq.token_ids + pending[i] if pending else seq.token_ids
                    for i, (_, seq) in enumerate(states)
                ]
            )
            if penalties
            else None
        ),
        prompt_ids=_padded([st.prompt_token_ids for st, _ in states]) if penalties else None,
        banned=[
            st.stop_token_ids if n_out[i] < st.params.min_tokens else None
            for i, (st, _) in enumerate(states)
        ],
        num_logprobs=np.array(
            [-1 if p.logprobs is None else p.logprobs for p in params], dtype=np.int64
        ),
        need_logprob=np.array([st.wants_logprobs for st, _ in states]),
    )


def _entries(
    token: int, lp: float, rank: int, top_ids: np.ndarray | None, top_lps: np.ndarray | None
) -> list[LogprobEntry]:
    """A position's logprob entries: the chosen token first, then the top ones."""
    entries: list[LogprobEntry] = [(token, lp, rank)]
    if top_ids is not None and top_lps is not None:
        seen = {token}
        for r, (t, v) in enumerate(zip(top_ids.tolist(), top_lps.tolist(), strict=True)):
            if t not in seen:
                seen.add(t)
                entries.append((t, v, r + 1))
    return entries


class StepDeltas:
    """The token-id deltas of one step, by request and sequence index."""

    def __init__(self) -> None:
        self.by_request: dict[str, tuple[RequestState, dict[int, SequenceDelta]]] = {}

    def seq(self, state: RequestState, seq: SequenceState) -> SequenceDelta:
        """The delta of ``seq`` in this step (made empty on first use)."""
        entry = self.by_request.get(state.request_id)
        if entry is None:
            entry = self.by_request[state.request_id] = (state, {})
        delta = entry[1].get(seq.index)
        if delta is None:
            delta = entry[1][seq.index] = SequenceDelta(seq.index, [])
        return delta

    def request_deltas(self) -> list[tuple[RequestState, RequestDelta]]:
        """Each request's delta of the step, with its finished sequences'
        finish and stop reasons and, with its first delta, its prompt
        logprobs, prefix-cache hit and first-schedule time (each sent once)."""
        out = []
        for state, seq_deltas in self.by_request.values():
            for seq in state.seqs:
                if seq.finish_reason is not None and seq.index in seq_deltas:
                    d = seq_deltas[seq.index]
                    d.finish_reason, d.stop_reason = seq.finish_reason, seq.stop_reason
            plp = None
            if state.prompt_logprobs is not None and not state.prompt_logprobs_sent:
                plp, state.prompt_logprobs_sent = state.prompt_logprobs, True
            cached = scheduled = None
            if state.num_cached_tokens is not None and not state.num_cached_tokens_sent:
                cached, state.num_cached_tokens_sent = state.num_cached_tokens, True
                scheduled = state.scheduled_time
            seqs = list(seq_deltas.values())
            delta = RequestDelta(state.request_id, seqs, state.finished, plp, cached, scheduled)
            out.append((state, delta))
        return out


def append_sampled(
    batch: StepBatch,
    out: SamplerOutput,
    owner: Owner,
    structured: StructuredOutputManager,
    deltas: StepDeltas,
    verified: Verified | None = None,
    ends: dict[int, int] | None = None,
) -> list[SequenceState]:
    """Append the step's tokens (row by row, ``num_samples`` each; a drafted
    row its accepted drafts and the token after them) to their sequences and
    to ``deltas``; advance each grammar matcher.

    Args:
        out: the sampler's output (with drafts: over the position rows).
        verified: the verify step's outcome, when the step had drafts.
        ends: output length of each sequence the scheduler finished in this
            step: a stop token, ``max_tokens`` or ``max_model_len`` inside an
            accepted run ends it there.
    Returns:
        the sequences a completed grammar ended (the caller tells the scheduler).
    Raises:
        GrammarRejectedError: a token outside its sequence's grammar.
    """
    completed: list[SequenceState] = []
    grammars = structured if len(structured) else None
    nd = batch.num_draft_tokens.tolist() if verified is not None else None
    k = 0
    for r, (rid, ns) in enumerate(
        zip(batch.sample_request_ids.tolist(), batch.num_samples.tolist(), strict=True)
    ):
        if verified is not None:
            k = int(verified.first_sample[r])
        if rid not in owner:  # a beam search row: the beam search owns it
            k += ns
            continue
        state, first = owner[rid]
        seqs = state.seqs if ns > 1 else [first]
        for seq in seqs[:ns]:
            delta = deltas.seq(state, seq)
            run = range(k, k + 1)
            if verified is not None and nd is not None and nd[r]:
                run = verified.run(r)
                delta.num_draft_tokens += nd[r]
                delta.num_accepted_tokens += int(verified.num_accepted[r])
            end = ends.get(seq.internal_id) if ends else None
            for i in run:
                if end is not None and len(seq.token_ids) >= end:
                    break  # finished inside the run: the rest were never appended
                _append(state, seq, delta, out, i)
                if grammars is not None and grammars.accept(seq.internal_id, seq.token_ids[-1]):
                    if seq.finish_reason is None:  # ended by EOS, with ignore_eos too
                        seq.finish_reason, seq.stop_reason = "stop", None
                        completed.append(seq)
                    break  # a completed grammar ends the run there
            k += 1
    return completed


def _append(
    state: RequestState, seq: SequenceState, delta: SequenceDelta, out: SamplerOutput, k: int
) -> None:
    """Append sample ``k`` to ``seq`` and its delta, with its logprobs."""
    token = int(out.token_ids[k])
    seq.token_ids.append(token)
    delta.token_ids.append(token)
    if out.logprobs is not None and state.wants_logprobs:
        lp = float(out.logprobs[k])
        seq.cumulative_logprob += lp
        delta.cumulative_logprob = seq.cumulative_logprob
        n_top = state.params.logprobs
        if n_top is not None:
            assert out.ranks is not None
            top_ids = out.top_ids[k, :n_top] if out.top_ids is not None else None
            top_lps = out.top_logprobs[k, :n_top] if out.top_logprobs is not None else None
            if delta.logprobs is None:
                delta.logprobs = []
            delta.logprobs.append(_entries(token, lp, int(out.ranks[k]), top_ids, top_lps))


def record_prompt_logprobs(
    batch: StepBatch, rows: np.ndarray, logits: torch.Tensor, owner: Owner
) -> None:
    """Record prompt logprob entries from the logits of prompt token ``rows``.

    The logits at a token predict the next position's prompt token.
    """
    logprobs = logits.float().log_softmax(dim=-1)
    positions = batch.positions[rows]
    seq_of_row = np.searchsorted(batch.query_start_loc, rows, side="right") - 1
    for i, (pos, s) in enumerate(zip(positions.tolist(), seq_of_row.tolist(), strict=True)):
        state, _ = owner[int(batch.seq_request_ids[s])]  # only owned rows are passed
        plp = state.prompt_logprobs
        if plp is None or pos + 1 >= len(state.prompt_token_ids) or len(plp) != pos + 1:
            continue  # not a prompt target, or already recorded (recompute)
        target = state.prompt_token_ids[pos + 1]
        row = logprobs[i]
        lp = float(row[target])
        rank = int((row > lp).sum()) + 1
        n_top = state.params.prompt_logprobs or 0
        top = row.topk(n_top) if n_top > 0 else None
        plp.append(
            _entries(
                target,
                lp,
                rank,
                None if top is None else top.indices.numpy(),
                None if top is None else top.values.numpy(),
            )
        )


def prompt_logprob_rows(batch: StepBatch, owner: Owner) -> np.ndarray | None:
    """Token rows of ``batch`` whose logits give prompt logprobs: every
    scheduled prompt token of a request asking for them, before its first
    output (None when none)."""
    qsl = batch.query_start_loc
    rows = []
    for s, rid in enumerate(batch.seq_request_ids.tolist()):
        if rid not in owner:
            continue
        state, seq = owner[rid]
        if state.prompt_logprobs is not None and seq.index == 0 and not seq.token_ids:
            rows.append(np.arange(qsl[s], qsl[s + 1]))
    return np.concatenate(rows) if rows else None


def jump_forward(
    batch: StepBatch, owner: Owner, core: Any, deltas: StepDeltas, done: set[int]
) -> list[Any]:
    """Jump-forward decoding after a step's tokens were appended: where a
    sequence's grammar (``jump_forward`` set) forces text after its sampled
    token, that token is replaced by the tokenizer's tokens of its text and
    the forced text (``CanonicalTokens``), in the sequence, its delta, its
    matcher and the scheduler (``replace_pending``: not computed yet, the
    next step computes them all). A forced token's logprob entry is the token
    alone with logprob 0; the sampled token's entry goes when it is replaced.

    Args:
        core: the ``EngineCore`` (its ``structured`` matchers, ``canonical``
            tokens, ``scheduler``).
        done: sequences that finished in this step (left as they are).
    Returns:
        the ``FinishedRequest`` of each sequence a forced token ended (a stop
        token, ``max_tokens``, ``max_model_len``).
    """
    structured: StructuredOutputManager = core.structured
    canonical: CanonicalTokens = core.canonical
    finished = []
    seqs: list[tuple[RequestState, SequenceState]] = []
    for rid, ns in zip(batch.sample_request_ids.tolist(), batch.num_samples.tolist(), strict=True):
        if rid in owner:
            state, first = owner[rid]
            seqs += [(state, seq) for seq in (state.seqs[:ns] if ns > 1 else [first])]
    for state, seq in seqs:
        sid = seq.internal_id
        if sid in done or seq.finish_reason is not None or not seq.token_ids:
            continue
        if state.wants_logprobs and state.params.logprobs is None:
            continue  # best_of ranks by the sampled tokens' logprobs
        forced = structured.forced_text(sid)
        if forced is None:
            continue
        token = seq.token_ids[-1]
        n_ctx = CONTEXT_TOKENS
        context = (state.prompt_token_ids[-n_ctx:] + seq.token_ids[-n_ctx - 1 : -1])[-n_ctx:]
        run = canonical.tokens(context, token, *forced)
        if run is None or not structured.replace_last(sid, token, run):
            continue
        try:
            n, fin = core.scheduler.replace_pending(sid, np.asarray(run, dtype=np.int64))
        except ValueError:  # not a single pending token: the matcher takes the token back
            structured.replace_last(sid, run[-1], [token], rollback=len(run))
            continue
        run = run[:n]
        if fin is not None:
            finished.append(fin)
        delta = deltas.seq(state, seq)
        assert delta.token_ids and delta.token_ids[-1] == token
        seq.token_ids[-1:] = run
        delta.token_ids[-1:] = run
        if delta.logprobs:
            kept = delta.logprobs[-1] if run[0] == token else None
            if kept is None:
                seq.cumulative_logprob -= delta.logprobs[-1][0][1]
                delta.cumulative_logprob = seq.cumulative_logprob
            delta.logprobs[-1:] = [kept or [(run[0], 0.0, 1)]] + [[(t, 0.0, 1)] for t in run[1:]]
    return finished
