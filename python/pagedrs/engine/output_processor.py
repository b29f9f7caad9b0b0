"""The front end's output processor: the engine core's token-id deltas become
``RequestOutput`` objects (detokenized text, stop strings, logprob texts,
n / best_of ranking), as vLLM v1's ``OutputProcessor``. Every front end
(``LLMEngine`` offline, ``AsyncLLM``) has one; it is the one place where
tokens turn into text.

A stop string found here finishes the sequence at once (later tokens of it are
ignored) and is reported in ``StepResult.stops``: the caller tells the core
(``EngineCore.stop_sequence``, or a ``StopSequence`` message), which frees the
sequence's blocks.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ..detokenizer import IncrementalDetokenizer
from ..outputs import CompletionOutput, Logprob, PositionLogprobs, RequestMetrics, RequestOutput
from ..sampling_params import SamplingParams
from .core.errors import InvalidRequestError
from .core.messages import LogprobEntry, RequestDelta


@dataclass
class SequenceOutputState:
    """One sequence of a request as the caller sees it.

    Attributes:
        index: position among the request's ``best_of`` sequences.
        detok: incremental detokenizer with the request's stop strings.
        token_ids: generated token ids.
        logprobs: per token, when the request asked for logprobs.
        cumulative_logprob: sum of the sampled tokens' logprobs (the core's).
        streamed_text: text handed out so far (safe deltas concatenated).
        finish_reason: "stop", "length", "abort", or None while running.
        stop_reason: the stop token id or stop string that ended it.
    """

    index: int
    detok: IncrementalDetokenizer
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[PositionLogprobs] | None = None
    cumulative_logprob: float = 0.0
    streamed_text: str = ""
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    def completion(self, final: bool, with_logprob: bool) -> CompletionOutput:
        """The sequence as an output: its final text once finished, else the
        text streamed so far; cumulative_logprob only when it was computed."""
        text = self.detok.output_text if final else self.streamed_text
        return CompletionOutput(
            index=self.index,
            text=text,
            token_ids=list(self.token_ids),
            finish_reason=self.finish_reason,
            stop_reason=self.stop_reason,
            cumulative_logprob=self.cumulative_logprob if with_logprob else None,
            logprobs=None if self.logprobs is None else list(self.logprobs),
        )


@dataclass
class RequestOutputState:
    """A live request as the caller sees it: prompt, parameters, sequences.

    Attributes:
        request_id: the caller's id (in its outputs).
        params: the request's ``SamplingParams``; None for a beam search, whose
            one output the core sends whole.
        prompt_logprobs: per prompt position (None first), when asked.
        num_cached_tokens: the prompt tokens the prefix cache held (from the
            core's first delta).
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams | None
    metrics: RequestMetrics
    seqs: list[SequenceOutputState]
    prompt_logprobs: list[PositionLogprobs | None] | None = None
    num_cached_tokens: int | None = None

    @property
    def finished(self) -> bool:
        """True when every sequence has finished."""
        return all(s.finish_reason is not None for s in self.seqs)

    @property
    def wants_logprobs(self) -> bool:
        """The sampled tokens' logprobs were computed (asked, or best_of ranking)."""
        p = self.params
        return p is not None and (p.logprobs is not None or (p.best_of or p.n) > p.n)

    def output(self) -> RequestOutput:
        """The request's output now; once finished, the n best sequences by
        cumulative logprob when best_of > n."""
        done = self.finished
        seqs = self.seqs
        if done and self.params is not None and len(seqs) > self.params.n:
            seqs = sorted(seqs, key=lambda s: -s.cumulative_logprob)[: self.params.n]
        outs = [s.completion(done, self.wants_logprobs) for s in seqs]
        for i, o in enumerate(outs):
            o.index = i
        return RequestOutput(
            self.request_id,
            self.prompt,
            self.prompt_token_ids,
            outs,
            done,
            self.metrics,
            self.prompt_logprobs,
            self.num_cached_tokens,
        )


@dataclass
class StepResult:
    """What applying one step's deltas produced.

    Attributes:
        outputs: ``(core id, output)`` for every request that advanced.
        stops: ``(core id, sequence index, stop string)`` of sequences a stop
            string ended here (the caller tells the core).
    """

    outputs: list[tuple[str, RequestOutput]] = field(default_factory=list)
    stops: list[tuple[str, int, str]] = field(default_factory=list)


class OutputProcessor:
    """The live requests' output states and the deltas applied to them.

    Not thread-safe: the caller serializes access.

    Args:
        tokenizer: the HF tokenizer (text of outputs and logprob entries).
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.states: dict[str, RequestOutputState] = {}

    def __contains__(self, core_id: str) -> bool:
        return core_id in self.states

    def __len__(self) -> int:
        return len(self.states)

    def add(
        self,
        core_id: str,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        params: SamplingParams,
        arrival_time: float,
    ) -> None:
        """Start following a sampling request.

        Args:
            core_id: the request's id in the core (unique among live requests;
                ``AsyncLLM`` makes it unique for its lifetime, so late deltas
                of an aborted request never reach a new one of the same id).
            request_id: the caller's id (in its outputs).
        Raises:
            InvalidRequestError: ``core_id`` is live.
            ValueError, TypeError: invalid stop strings.
        """
        self.check_new_id(core_id)
        stop = list(params.stop or [])
        seqs = [
            SequenceOutputState(
                i,
                IncrementalDetokenizer(
                    self.tokenizer,
                    prompt_token_ids,
                    params.skip_special_tokens,
                    stop,
                    params.include_stop_str_in_output,
                ),
            )
            for i in range(params.best_of or params.n)
        ]
        self.states[core_id] = RequestOutputState(
            request_id,
            prompt,
            prompt_token_ids,
            params,
            RequestMetrics(arrival_time),
            seqs,
            prompt_logprobs=[None] if params.prompt_logprobs is not None else None,
        )

    def add_beam_search(
        self,
        core_id: str,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        arrival_time: float,
    ) -> None:
        """Start following a beam search request (its one delta comes at the end).

        Raises:
            InvalidRequestError: ``core_id`` is live.
        """
        self.check_new_id(core_id)
        self.states[core_id] = RequestOutputState(
            request_id, prompt, prompt_token_ids, None, RequestMetrics(arrival_time), []
        )

    def check_new_id(self, core_id: str) -> None:
        """Raises ``InvalidRequestError`` if ``core_id`` is live."""
        if core_id in self.states:
            raise InvalidRequestError(f"request id {core_id!r} is already in use")

    def finish(self, core_id: str, reason: str = "abort") -> RequestOutput | None:
        """Stop following a request: unfinished sequences end with ``reason``;
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
            if state.params is None:  # a beam search: its one, final delta
                del self.states[d.request_id]
                state.metrics.finished_time = now
                result.outputs.append((d.request_id, self._beam_output(d, state)))
                continue
            self._apply_sampling(d, state, result)
            if state.metrics.first_token_time is None:
                state.metrics.first_token_time = now
            if d.finished:  # the core holds nothing more of it
                for seq in state.seqs:
                    if seq.finish_reason is None:
                        seq.finish_reason = "abort"
            if state.finished:
                del self.states[d.request_id]
                state.metrics.finished_time = now
            result.outputs.append((d.request_id, state.output()))
        return result

    def _apply_sampling(
        self, d: RequestDelta, state: RequestOutputState, result: StepResult
    ) -> None:
        if d.num_cached_tokens is not None:
            state.num_cached_tokens = d.num_cached_tokens
        if d.scheduled_time is not None:
            state.metrics.first_scheduled_time = d.scheduled_time
        if d.prompt_logprobs is not None:
            state.prompt_logprobs = [
                None if p is None else self._position(p) for p in d.prompt_logprobs
            ]
        for sd in d.seqs:
            seq = state.seqs[sd.index]
            if seq.finish_reason is not None:
                continue  # a stop string ended it here
            if sd.num_draft_tokens:
                state.metrics.spec_num_drafts += 1
                state.metrics.spec_num_draft_tokens += sd.num_draft_tokens
                state.metrics.spec_num_accepted_tokens += sd.num_accepted_tokens
            stop = None
            kept = len(sd.token_ids)
            for j, token in enumerate(sd.token_ids):
                seq.token_ids.append(token)
                if sd.logprobs is not None:
                    if seq.logprobs is None:
                        seq.logprobs = []
                    seq.logprobs.append(self._position(sd.logprobs[j]))
                stop = seq.detok.append([token])
                if stop is not None:
                    kept = j + 1
                    break
            if sd.cumulative_logprob is not None:
                if kept < len(sd.token_ids) and sd.logprobs is not None:
                    # A stop string inside a run of several tokens (speculative
                    # decoding): the sum of the kept ones, added as the core adds.
                    for entries in sd.logprobs[:kept]:
                        seq.cumulative_logprob += entries[0][1]
                else:
                    seq.cumulative_logprob = sd.cumulative_logprob
            if stop is not None:
                seq.finish_reason, seq.stop_reason = "stop", stop
                if sd.finish_reason is None:  # the core still runs it
                    result.stops.append((d.request_id, sd.index, stop))
            elif sd.finish_reason is not None:
                seq.finish_reason, seq.stop_reason = sd.finish_reason, sd.stop_reason
            seq.streamed_text += seq.detok.next_delta(finished=seq.finish_reason is not None)

    def _beam_output(self, d: RequestDelta, state: RequestOutputState) -> RequestOutput:
        """A beam search's output: its hypotheses, each text the decode of its
        whole token ids."""
        outs = [
            CompletionOutput(
                index=sd.index,
                text=self.tokenizer.decode(sd.token_ids, skip_special_tokens=True),
                token_ids=list(sd.token_ids),
                finish_reason=sd.finish_reason,
                stop_reason=sd.stop_reason,
                cumulative_logprob=sd.cumulative_logprob,
            )
            for sd in d.seqs
        ]
        return RequestOutput(
            state.request_id, state.prompt, state.prompt_token_ids, outs, True, state.metrics
        )

    def _position(self, entries: list[LogprobEntry]) -> PositionLogprobs:
        decode = self.tokenizer.decode
        return {tok: Logprob(lp, rank, decode([tok])) for tok, lp, rank in entries}
