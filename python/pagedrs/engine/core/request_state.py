"""The engine core's state of a request between steps: what the scheduler's
sequences generated (token ids, for penalties), their summed logprobs, how they
finished. No text: the front end's output processor holds that."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...sampling_params import SamplingParams
from .messages import LogprobEntry


@dataclass
class SequenceState:
    """One generated sequence of a request (n / best_of of them).

    Attributes:
        internal_id: id of the sequence in the Rust scheduler.
        index: position among the request's sequences.
        token_ids: generated token ids.
        cumulative_logprob: sum of the sampled tokens' logprobs.
        finish_reason: "stop", "length", "abort", or None while running.
        stop_reason: the stop token id or stop string that ended it.
    """

    internal_id: int
    index: int
    token_ids: list[int] = field(default_factory=list)
    cumulative_logprob: float = 0.0
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class RequestState:
    """A request in flight in the engine core: its prompt, parameters and sequences.

    Attributes:
        stop_token_ids: EOS (unless ignore_eos) and the request's stop token ids;
            masked while fewer than min_tokens are generated.
        prompt_logprobs: per prompt position (None first) as logprob entries,
            when asked; sent with the request's first delta.
        prompt_logprobs_sent: the first delta carried them.
        special: needs the sampler's extra inputs (min-p, penalties,
            min_tokens, logprobs, best_of ranking).
        num_cached_tokens: prompt tokens the prefix cache held when the
            request was first scheduled (None until then); sent with its first delta.
        num_cached_tokens_sent: the first delta carried it.
        scheduled_time: when the step that first scheduled the request began
            (seconds since the epoch; None until then); sent with its first delta.
    """

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    seqs: list[SequenceState]
    stop_token_ids: list[int]
    prompt_logprobs: list[list[LogprobEntry] | None] | None = None
    prompt_logprobs_sent: bool = False
    special: bool = False
    wants_logprobs: bool = False
    num_cached_tokens: int | None = None
    num_cached_tokens_sent: bool = False
    scheduled_time: float | None = None

    @classmethod
    def of_sequences(
        cls,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        internal_ids: list[int],
        stop_token_ids: list[int],
    ) -> RequestState:
        """A sampling request's state: one sequence per id of ``internal_ids``
        (best_of of them, ``n`` returned), ``special`` from the parameters,
        prompt logprobs collected when asked."""
        wants_logprobs = params.logprobs is not None or len(internal_ids) > params.n
        return cls(
            request_id,
            list(prompt_token_ids),
            params,
            [SequenceState(iid, i) for i, iid in enumerate(internal_ids)],
            stop_token_ids,
            prompt_logprobs=[None] if params.prompt_logprobs is not None else None,
            special=(
                params.min_p > 0
                or params.needs_penalties
                or params.min_tokens > 0
                or wants_logprobs
            ),
            wants_logprobs=wants_logprobs,
        )

    @property
    def finished(self) -> bool:
        """True when every sequence has finished."""
        return all(s.finish_reason is not None for s in self.seqs)
