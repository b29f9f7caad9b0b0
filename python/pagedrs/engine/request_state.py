"""Per-request and per-sequence output state kept by the engine between steps."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..detokenizer import IncrementalDetokenizer, NullDetokenizer
from ..outputs import CompletionOutput, PositionLogprobs, RequestMetrics, RequestOutput
from ..sampling_params import SamplingParams


@dataclass
class SequenceState:
    """One generated sequence of a request (n / best_of of them).

    Attributes:
        internal_id: id of the sequence in the Rust scheduler.
        index: position among the request's sequences.
        detok: incremental detokenizer with the request's stop strings.
        token_ids: generated token ids.
        logprobs: per token, when the request asked for logprobs.
        cumulative_logprob: sum of the sampled tokens' logprobs.
        streamed_text: text handed out so far (safe deltas concatenated).
        finish_reason: "stop", "length", "abort", or None while running.
        stop_reason: the stop token id or stop string that ended it.
    """

    internal_id: int
    index: int
    detok: IncrementalDetokenizer | NullDetokenizer
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
class RequestState:
    """A request in flight: its prompt, parameters and sequences.

    Attributes:
        stop_token_ids: EOS (unless ignore_eos) and the request's stop token ids;
            masked while fewer than min_tokens are generated.
        prompt_logprobs: per prompt position (None first), when asked.
        special: needs the sampler's extra inputs (min-p, penalties,
            min_tokens, logprobs, best_of ranking).
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    metrics: RequestMetrics
    seqs: list[SequenceState]
    stop_token_ids: list[int]
    prompt_logprobs: list[PositionLogprobs | None] | None = None
    special: bool = False

    @property
    def finished(self) -> bool:
        """True when every sequence has finished."""
        return all(s.finish_reason is not None for s in self.seqs)

    @property
    def wants_logprobs(self) -> bool:
        """The sampled tokens' logprobs are needed (asked, or best_of ranking)."""
        best_of = self.params.best_of or self.params.n
        return self.params.logprobs is not None or best_of > self.params.n

    def output(self) -> RequestOutput:
        """The request's output now; once finished, the n best sequences by
        cumulative logprob when best_of > n."""
        done = self.finished
        seqs = self.seqs
        if done and len(seqs) > self.params.n:
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
        )
