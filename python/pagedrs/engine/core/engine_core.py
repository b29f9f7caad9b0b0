"""``EngineCore``: the engine-core process's view of an ``LLMEngine``.

It applies the front end's messages between steps and turns each step into
token-id deltas (vLLM v1's ``EngineCore`` behind ``AsyncLLM``). The engine runs
with ``detokenize=False``: no text and no stop strings here; the front end finds
stop strings and stops the sequence (``StopSequence``) or the request.
"""

from __future__ import annotations

import logging
import time

from ...outputs import PositionLogprobs
from ..errors import StepFailedError
from ..llm_engine import LLMEngine
from ..request_state import RequestState
from .messages import (
    AbortRequests,
    AddRequest,
    CoreInput,
    CoreOutputs,
    LogprobEntry,
    RequestDelta,
    RequestError,
    SequenceDelta,
    StopSequence,
)

logger = logging.getLogger(__name__)


def _entries(position: PositionLogprobs) -> list[LogprobEntry]:
    return [(tok, lp.logprob, lp.rank) for tok, lp in position.items()]


class EngineCore:
    """Applies inputs and runs steps of ``engine``, reporting deltas.

    Args:
        engine: an engine built with ``detokenize=False``; nothing else may
            call it.
    """

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._sent: dict[str, list[int]] = {}  # tokens reported per sequence
        self._errors: list[RequestError] = []
        self._num_added = 0

    def apply(self, msg: CoreInput) -> None:
        """Apply one front-end message (``Shutdown`` is the caller's)."""
        if isinstance(msg, AddRequest):
            try:
                self.engine.add_request(
                    msg.request_id,
                    msg.prompt_token_ids,
                    msg.params,
                    arrival_time=msg.arrival_time,
                    cache_salt=msg.cache_salt,
                    priority=msg.priority,
                )
            except (ValueError, TypeError, OverflowError) as exc:
                self._errors.append(RequestError(msg.request_id, "invalid", str(exc)))
            self._num_added += 1
        elif isinstance(msg, AbortRequests):
            for rid in msg.request_ids:
                self._sent.pop(rid, None)
                self.engine.abort_request(rid)
        elif isinstance(msg, StopSequence):
            self.engine.stop_sequence(msg.request_id, msg.index, msg.stop_reason)
            state = self.engine.registry.get(msg.request_id)
            if state is None:
                self._sent.pop(msg.request_id, None)

    def has_work(self) -> bool:
        """True while a request is waiting or running."""
        return self.engine.has_unfinished_requests()

    def step(self) -> CoreOutputs:
        """Run one step (if any request is live) and collect its deltas, the
        errors since the last call and the engine's counters."""
        deltas: list[RequestDelta] = []
        t0 = time.perf_counter()
        ran = self.engine.has_unfinished_requests()
        if ran:
            try:
                states = self.engine.step_states()
            except StepFailedError as exc:
                logger.exception("a step failed; aborting its requests")
                for rid in exc.request_ids:
                    self._sent.pop(rid, None)
                    self.engine.abort_request(rid)
                    msg = f"the model loop failed on this request: {exc}"
                    self._errors.append(RequestError(rid, "failed", msg))
            else:
                deltas = [self._delta(st) for st in states]
        out = CoreOutputs(
            deltas,
            self._errors,
            self.engine.kv_cache_stats(),
            time.perf_counter() - t0 if ran else 0.0,
            self._num_added,
        )
        self._errors, self._num_added = [], 0
        return out

    def _delta(self, state: RequestState) -> RequestDelta:
        rid = state.request_id
        first = rid not in self._sent
        sent = self._sent.setdefault(rid, [0] * len(state.seqs))
        done = state.finished
        seqs = []
        for seq in state.seqs:
            k = sent[seq.index]
            if len(seq.token_ids) == k and not done:
                continue
            sent[seq.index] = len(seq.token_ids)
            seqs.append(
                SequenceDelta(
                    seq.index,
                    seq.token_ids[k:],
                    None if seq.logprobs is None else [_entries(p) for p in seq.logprobs[k:]],
                    seq.cumulative_logprob if state.wants_logprobs else None,
                    seq.finish_reason,
                    seq.stop_reason,
                )
            )
        if done:
            del self._sent[rid]
        plp = None
        if first and state.prompt_logprobs is not None:
            plp = [None if p is None else _entries(p) for p in state.prompt_logprobs]
        return RequestDelta(rid, seqs, done, plp)
