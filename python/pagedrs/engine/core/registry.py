"""The engine's bookkeeping of live requests: which sequence (the scheduler's
integer id) belongs to which request, and the counters that let a step skip
per-row work nobody asked for. Kept in one place so the maps never drift."""

from __future__ import annotations

from .beam_search import BeamSearchRequest
from .errors import InvalidRequestError
from .request_state import RequestState, SequenceState

Owner = dict[int, tuple[RequestState, SequenceState]]


class RequestRegistry:
    """Live sampling and beam-search requests by id, and their sequences.

    Attributes:
        owner: sequence id -> (request, sequence) for sampling requests.
        beam_of: sequence id -> its beam-search request.
        num_special: live sampling requests needing sampler extras (min-p,
            penalties, min_tokens, logprobs, best_of > n).
        num_prompt_logprobs: live sampling requests wanting prompt logprobs.
        unscheduled: first sequence id -> request, of sampling requests not
            scheduled yet (their prefix-cache hit is read at their first step).
    """

    def __init__(self) -> None:
        self.owner: Owner = {}
        self.beam_of: dict[int, BeamSearchRequest] = {}
        self.num_special = 0
        self.num_prompt_logprobs = 0
        self.unscheduled: dict[int, RequestState] = {}
        self._requests: dict[str, RequestState] = {}
        self._beams: dict[str, BeamSearchRequest] = {}

    def check_new_id(self, request_id: str) -> None:
        """Raises ``InvalidRequestError`` if ``request_id`` is live."""
        if request_id in self._requests or request_id in self._beams:
            raise InvalidRequestError(f"request id {request_id!r} is already in use")

    def request_ids(self) -> list[str]:
        """The ids of every live request (sampling and beam search)."""
        return [*self._requests, *self._beams]

    def add(self, state: RequestState) -> None:
        """Register a sampling request and its sequences (its id was checked
        with ``check_new_id`` before the scheduler queued it)."""
        self._requests[state.request_id] = state
        self.num_special += state.special
        self.num_prompt_logprobs += state.prompt_logprobs is not None
        for seq in state.seqs:
            self.owner[seq.internal_id] = (state, seq)
        self.unscheduled[state.seqs[0].internal_id] = state

    def add_beam(self, beam: BeamSearchRequest, first_seq: int) -> None:
        """Register a beam-search request and its first sequence (its id was
        checked with ``check_new_id`` before the scheduler queued it)."""
        self._beams[beam.request_id] = beam
        self.beam_of[first_seq] = beam

    def get(self, request_id: str) -> RequestState | None:
        """A live sampling request."""
        return self._requests.get(request_id)

    def pop_beam(self, request_id: str) -> BeamSearchRequest | None:
        """Forget a beam-search request and its sequences; returns it (or None)."""
        beam = self._beams.pop(request_id, None)
        if beam is not None:
            for seq in beam.seq_ids():
                self.beam_of.pop(seq, None)
        return beam

    def release(self, state: RequestState) -> None:
        """Forget a finished sampling request and its sequences."""
        del self._requests[state.request_id]
        self.num_special -= state.special
        self.num_prompt_logprobs -= state.prompt_logprobs is not None
        for seq in state.seqs:
            self.owner.pop(seq.internal_id, None)
        self.unscheduled.pop(state.seqs[0].internal_id, None)

    def note_first_schedules(
        self,
        seq_ids: list[int],
        query_start_loc: list[int],
        seq_lens: list[int],
        step_start: float,
    ) -> None:
        """Record the prefix-cache hit of requests in their first step: a
        sequence's context length before the step (``seq_lens`` minus its
        scheduled tokens) is the prompt tokens the cache held.

        Args:
            seq_ids: the step's sequence ids (``StepBatch.seq_request_ids``).
            query_start_loc: ``[S + 1]`` offsets of each sequence's tokens.
            seq_lens: ``[S]`` context lengths after the step.
            step_start: when the step began (seconds since the epoch): the
                requests' ``scheduled_time``.
        """
        for i, sid in enumerate(seq_ids):
            state = self.unscheduled.pop(sid, None)
            if state is not None:
                new = query_start_loc[i + 1] - query_start_loc[i]
                state.num_cached_tokens = seq_lens[i] - new
                state.scheduled_time = step_start

    def request_id_of(self, seq_id: int) -> str | None:
        """The request a sequence belongs to (sampling or beam search)."""
        owner = self.owner.get(seq_id)
        if owner is not None:
            return owner[0].request_id
        beam = self.beam_of.get(seq_id)
        return beam.request_id if beam is not None else None
