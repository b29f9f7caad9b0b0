"""Request outputs, shaped like vLLM's ``RequestOutput`` / ``CompletionOutput``."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CompletionOutput:
    """One generated sequence.

    Attributes:
        index: position among the request's outputs.
        text: detokenized output.
        token_ids: generated token ids (a stop token that ended it included).
        finish_reason: "stop" (EOS or stop token), "length" (max_tokens or
            max_model_len), "abort", or None while unfinished.
        stop_reason: the stop token id or stop string that ended it, if any.
        cumulative_logprob: sum of the sampled tokens' logprobs (None unless
            logprobs were asked for, or best_of > n ranked the sequences).
        logprobs: per generated token, its Logprob and the top ones, when asked.
    """

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    cumulative_logprob: float | None = None
    logprobs: list[PositionLogprobs] | None = None

    def finished(self) -> bool:
        """True once a finish reason is set."""
        return self.finish_reason is not None


@dataclass
class RequestMetrics:
    """Timestamps of one request, in seconds since the epoch, and its
    speculative decoding counts.

    Attributes:
        arrival_time: when it was added to the engine (after tokenizing).
        first_scheduled_time: when the engine step that first scheduled it
            began; ``first_scheduled_time - arrival_time`` is its time queued,
            ``first_token_time - first_scheduled_time`` its prefill (every
            chunk of it, and the first token's sampling and delivery).
        first_token_time: when its first token reached the output processor.
        finished_time: when it finished.
        spec_num_draft_tokens: draft tokens proposed for its sequences.
        spec_num_accepted_tokens: those the model accepted (the mean accepted
            length per verify step is ``1 + accepted / verify steps``).
        spec_num_drafts: verify steps of its sequences that carried drafts.
    """

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    spec_num_drafts: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0


@dataclass
class RequestOutput:
    """The result of one request.

    Attributes:
        request_id: the caller's id.
        prompt: prompt text (None when given as token ids).
        prompt_token_ids: prompt tokens.
        outputs: generated sequences.
        finished: True when every output is finished.
        prompt_logprobs: per prompt token (None for the first), when asked.
        num_cached_tokens: prompt tokens found in the prefix cache (computed
            by an earlier request, not prefilled again); None until the request
            is first scheduled, and for beam searches (vLLM's field).
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics | None = field(default=None, repr=False)
    prompt_logprobs: list[PositionLogprobs | None] | None = None
    num_cached_tokens: int | None = None


@dataclass
class Logprob:
    """Log-probability of one token at one position.

    Attributes:
        logprob: natural log of its probability under the model (raw logits).
        rank: 1 for the most likely token.
        decoded_token: its text.
    """

    logprob: float
    rank: int
    decoded_token: str | None = None


# Per position: token id -> Logprob (the chosen token and the top-k).
PositionLogprobs = dict[int, Logprob]
