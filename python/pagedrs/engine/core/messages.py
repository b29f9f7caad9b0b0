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
from ...sampling_params import SamplingParams

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


class AbortRequests(msgspec.Struct, tag="abort", array_like=True):
    """Abort requests (every sequence); unknown ids are ignored."""

    request_ids: list[str]


class StopSequence(msgspec.Struct, tag="stop", array_like=True):
    """Finish one sequence of a request: the front end found a stop string."""

    request_id: str
    index: int
    stop_reason: str | None = None


class Shutdown(msgspec.Struct, tag="shutdown", array_like=True):
    """Abort everything and exit."""


CoreInput = AddRequest | AbortRequests | StopSequence | Shutdown


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


class CoreOutputs(msgspec.Struct, tag="outputs", array_like=True):
    """One step's results, or the results of applying inputs between steps.

    Attributes:
        stats: the engine's ``kv_cache_stats()`` after the step.
        step_time: seconds the step took in the core (0 when no step ran).
        num_added: ``AddRequest`` messages applied since the last outputs.
        num_aborts: ``AbortRequests`` messages applied since the last outputs
            (their requests' blocks are free in ``stats``).
    """

    deltas: list[RequestDelta]
    errors: list[RequestError]
    stats: dict[str, Any]
    step_time: float = 0.0
    num_added: int = 0
    num_aborts: int = 0


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
    return msgspec.msgpack.Decoder(CoreInput)  # type: ignore[arg-type]


def output_decoder() -> msgspec.msgpack.Decoder[CoreOutput]:
    """A decoder of the core's messages."""
    return msgspec.msgpack.Decoder(CoreOutput)  # type: ignore[arg-type]
