"""The messages between the front end and the engine-core process.

They cross the process boundary as msgpack (``msgspec``) over ZeroMQ: the front
end sends requests, aborts and stops; the core sends, once per step, the new
token ids of every request that advanced, the errors of the requests that
failed, and the engine's counters. Text never crosses: the front end tokenizes
and detokenizes.

A logprob entry is ``(token_id, logprob, rank)``; a position's entries start
with the sampled (or prompt) token, then the top ones.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ...lora.request import LoRARequest
from ...sampling_params import BeamSearchParams, SamplingParams

LogprobEntry = tuple[int, float, int]


# ------------------------------------------------------------- front end -> core


class AddRequest(msgspec.Struct, tag="add", array_like=True):
    """Queue a request (validated by the front end; the core checks again).
    In-process front ends hand the same struct to ``EngineCore.add_request``."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float
    cache_salt: str | None = None
    priority: int = 0
    lora_request: LoRARequest | None = None  # LoRA (pagedrs.lora)


class AddBeamSearchRequest(msgspec.Struct, tag="add_beam", array_like=True):
    """Queue a beam search request (validated by the front end): its one delta
    comes when the search is over, the finished hypotheses best first."""

    request_id: str
    prompt_token_ids: list[int]
    params: BeamSearchParams
    arrival_time: float
    lora_request: LoRARequest | None = None  # LoRA (pagedrs.lora): every beam runs it


class AbortRequests(msgspec.Struct, tag="abort", array_like=True):
    """Abort requests (every sequence); unknown ids are ignored."""

    request_ids: list[str]


class StopSequence(msgspec.Struct, tag="stop", array_like=True):
    """Finish one sequence of a request: the front end found a stop string."""

    request_id: str
    index: int
    stop_reason: str | None = None


class UtilityCall(msgspec.Struct, tag="call", array_like=True):
    """Call one of the core's ``UTILITY_METHODS`` between steps; its
    ``UtilityResult`` comes with the next ``CoreOutputs``.

    Attributes:
        call_id: the caller's number for the call (unique among its open calls).
        method: the ``EngineCore`` method's name.
    """

    call_id: int
    method: str


class Shutdown(msgspec.Struct, tag="shutdown", array_like=True):
    """Abort everything and exit."""


CoreInput = (
    AddRequest | AddBeamSearchRequest | AbortRequests | StopSequence | UtilityCall | Shutdown
)

# The ``EngineCore`` methods a ``UtilityCall`` may name: no arguments, a
# msgpack-able result.
UTILITY_METHODS = frozenset({"reset_prefix_cache", "kv_cache_stats"})


def check_utility(method: str) -> None:
    """Raises:
    ValueError: ``method`` is not one of ``UTILITY_METHODS``."""
    if method not in UTILITY_METHODS:
        raise ValueError(f"the engine core has no utility {method!r}: {sorted(UTILITY_METHODS)}")


# ------------------------------------------------------------- core -> front end


class SequenceDelta(msgspec.Struct, array_like=True):
    """What one sequence gained in a step.

    Attributes:
        index: the sequence's position among its request's ``best_of``.
        token_ids: the new token ids (one per decode step; under speculative
            decoding the accepted drafts and the model's token after them).
        logprobs: per new token, its entries, when the request asked for logprobs.
        cumulative_logprob: the sum over all its tokens so far, when computed.
        finish_reason: "stop", "length", "abort", or None while running.
        stop_reason: the stop token id that ended it, if any.
        num_draft_tokens: draft tokens speculative decoding proposed for it
            in the step.
        num_accepted_tokens: those the model accepted (each is in
            ``token_ids``, before the model's own next token).
    """

    index: int
    token_ids: list[int]
    logprobs: list[list[LogprobEntry]] | None = None
    cumulative_logprob: float | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0


class RequestDelta(msgspec.Struct, array_like=True):
    """What one request gained in a step.

    Attributes:
        prompt_logprobs: per prompt position (None for the first), sent once,
            with the request's first delta, when asked.
        num_cached_tokens: prompt tokens found in the prefix cache when the
            request was first scheduled (not prefilled), sent once, with the
            request's first delta.
        scheduled_time: when the step that first scheduled the request began
            (seconds since the epoch, the core's clock), with the first delta.
    """

    request_id: str
    seqs: list[SequenceDelta]
    finished: bool
    prompt_logprobs: list[list[LogprobEntry] | None] | None = None
    num_cached_tokens: int | None = None
    scheduled_time: float | None = None


class RequestError(msgspec.Struct, array_like=True):
    """A request the core refused ("invalid": bad input, nothing ran) or lost
    ("failed": a step holding it raised; it was aborted).

    Attributes:
        param, code: those of the ``InvalidRequestError`` that refused it.
    """

    request_id: str
    kind: str
    message: str
    param: str | None = None
    code: str | None = None


class UtilityResult(msgspec.Struct, array_like=True):
    """The answer to one ``UtilityCall``: its result, or the error it raised
    (``error``: the exception's type name and message)."""

    call_id: int
    result: Any = None
    error: str | None = None


class CoreOutputs(msgspec.Struct, tag="outputs", array_like=True):
    """One step's results, or the results of applying inputs between steps.

    Attributes:
        stats: the engine's ``kv_cache_stats()`` after the step.
        step_time: seconds the step took in the core (0 when no step ran).
        num_added: ``AddRequest`` messages applied since the last outputs.
        num_aborts: ``AbortRequests`` messages applied since the last outputs
            (their requests' blocks are free in ``stats``).
        results: the answers to the ``UtilityCall`` messages applied since
            the last outputs.
    """

    deltas: list[RequestDelta]
    errors: list[RequestError]
    stats: dict[str, Any]
    step_time: float = 0.0
    num_added: int = 0
    num_aborts: int = 0
    results: list[UtilityResult] = msgspec.field(default_factory=list)


class CoreReady(msgspec.Struct, tag="ready", array_like=True):
    """The core built its engine and serves."""

    max_model_len: int
    vocab_size: int
    stats: dict[str, Any]


class CoreFailed(msgspec.Struct, tag="failed", array_like=True):
    """The core could not start, or its loop died; it exits after sending this.

    Attributes:
        kind: the exception's type name (``ValueError`` for bad arguments).
    """

    kind: str
    message: str


CoreOutput = CoreOutputs | CoreReady | CoreFailed


def input_decoder() -> msgspec.msgpack.Decoder[CoreInput]:
    """A decoder of the front end's messages."""
    return msgspec.msgpack.Decoder(CoreInput)


def output_decoder() -> msgspec.msgpack.Decoder[CoreOutput]:
    """A decoder of the core's messages."""
    return msgspec.msgpack.Decoder(CoreOutput)
