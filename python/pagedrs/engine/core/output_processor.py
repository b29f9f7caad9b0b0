"""The front end's half of output processing: the core's token-id deltas become
``RequestOutput`` objects (detokenized text, stop strings, logprob texts,
best_of ranking), as vLLM v1's front-end ``OutputProcessor``.

Each live request keeps a ``RequestState`` mirror whose sequences hold real
``IncrementalDetokenizer`` objects. A stop string found here finishes the
sequence at once (later tokens of it are ignored) and the caller tells the core
(``StopSequence``, or ``AbortRequests`` once the whole request is done).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ...detokenizer import IncrementalDetokenizer
from ...outputs import Logprob, PositionLogprobs, RequestMetrics, RequestOutput
from ...sampling_params import SamplingParams
from ..request_state import RequestState, SequenceState
from .messages import LogprobEntry, RequestDelta


@dataclass
class StepResult:
    """What applying one step's deltas produced.

    Attributes:
        outputs: ``(core id, output)`` for every request that advanced.
        stops: ``(core id, sequence index, stop string)`` of sequences a
            stop string ended while their request goes on.
        aborts: requests finished here that the core still runs.
    """

    outputs: list[tuple[str, RequestOutput]] = field(default_factory=list)
    stops: list[tuple[str, int, str]] = field(default_factory=list)
    aborts: list[str] = field(default_factory=list)


class FrontendOutputProcessor:
    """Mirrors of the live requests and the deltas applied to them.

    Not thread-safe: the caller serializes access.

    Args:
        tokenizer: the HF tokenizer (text of outputs and logprob entries).
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.states: dict[str, RequestState] = {}

    def add(
        self,
        core_id: str,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        params: SamplingParams,
        arrival_time: float,
    ) -> None:
        """Start mirroring a request.

        Args:
            core_id: the request's id in the core (unique for the front end's
                lifetime, so late deltas of an aborted request never reach a
                new request of the same caller's id).
            request_id: the caller's id (in its outputs).
        Raises:
            ValueError, TypeError: invalid stop strings.
        """
        best_of = params.best_of or params.n
        stop = list(params.stop or [])
        seqs = [
            SequenceState(
                -1,
                i,
                IncrementalDetokenizer(
                    self.tokenizer,
                    prompt_token_ids,
                    params.skip_special_tokens,
                    stop,
                    params.include_stop_str_in_output,
                ),
            )
            for i in range(best_of)
        ]
        self.states[core_id] = RequestState(
            request_id,
            prompt,
            prompt_token_ids,
            params,
            RequestMetrics(arrival_time),
            seqs,
            list(params.stop_token_ids),
            prompt_logprobs=[None] if params.prompt_logprobs is not None else None,
        )

    def finish(self, core_id: str, reason: str = "abort") -> RequestOutput | None:
        """Stop mirroring a request: unfinished sequences end with ``reason``;
        returns its final output, or None if it is not live."""
        state = self.states.pop(core_id, None)
        if state is None:
            return None
        for seq in state.seqs:
            if seq.finish_reason is None:
                seq.finish_reason = reason
        state.metrics.finished_time = time.time()
        return state.output()

    def apply(self, deltas: list[RequestDelta]) -> StepResult:
        """Apply one step's deltas (deltas of requests no longer live are
        dropped: finished here by a stop string, or aborted)."""
        result = StepResult()
        now = time.time()
        for d in deltas:
            state = self.states.get(d.request_id)
            if state is None:
                continue
            if d.prompt_logprobs is not None:
                state.prompt_logprobs = [
                    None if p is None else self._position(p) for p in d.prompt_logprobs
                ]
            if state.metrics.first_token_time is None:
                state.metrics.first_token_time = now
            for sd in d.seqs:
                seq = state.seqs[sd.index]
                if seq.finish_reason is not None:
                    continue  # a stop string ended it here
                stop = None
                for j, token in enumerate(sd.token_ids):
                    seq.token_ids.append(token)
                    if sd.logprobs is not None:
                        if seq.logprobs is None:
                            seq.logprobs = []
                        seq.logprobs.append(self._position(sd.logprobs[j]))
                    stop = seq.detok.append([token])
                    if stop is not None:
                        break
                if sd.cumulative_logprob is not None:
                    seq.cumulative_logprob = sd.cumulative_logprob
                if stop is not None:
                    seq.finish_reason, seq.stop_reason = "stop", stop
                    result.stops.append((d.request_id, sd.index, stop))
                elif sd.finish_reason is not None:
                    seq.finish_reason, seq.stop_reason = sd.finish_reason, sd.stop_reason
                seq.streamed_text += seq.detok.next_delta(finished=seq.finish_reason is not None)
            if d.finished:  # the core holds nothing more of it
                for seq in state.seqs:
                    if seq.finish_reason is None:
                        seq.finish_reason = "abort"
            if state.finished:
                del self.states[d.request_id]
                state.metrics.finished_time = now
                if not d.finished:
                    result.aborts.append(d.request_id)
                result.stops = [s for s in result.stops if s[0] != d.request_id]
            result.outputs.append((d.request_id, state.output()))
        return result

    def _position(self, entries: list[LogprobEntry]) -> PositionLogprobs:
        decode = self.tokenizer.decode
        return {tok: Logprob(lp, rank, decode([tok])) for tok, lp, rank in entries}
