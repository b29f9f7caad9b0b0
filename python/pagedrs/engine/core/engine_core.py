"""``EngineCore``: the step. Scheduler, executor, sampler, beam search and
grammars; requests in, token-id deltas out (vLLM v1's ``EngineCore``).

One ``step()`` is the loop of ARCHITECTURE.md: schedule (Rust) -> apply block
moves and run the model (executor) -> sample -> update (Rust) -> deltas. It
produces no text: every front end (``LLMEngine`` offline, ``AsyncLLM``) turns
the deltas into outputs with its ``OutputProcessor``, finds stop strings there
and calls ``stop_sequence``. Building the parts lives in ``setup``, request
bookkeeping in ``registry``, beam search in ``beam_coordinator`` and
``beam_search``, grammar matchers and bitmasks in ``structured_output``.
"""

from __future__ import annotations

import itertools
import time
import uuid
from typing import Any

import numpy as np
import pagedrs._core as _core
import torch

from ...distributed.errors import WorkerDiedError
from ...executor.sampler import Sampler
from ...lora.manager import add_lora_request
from ...spec_decode import speculation_off_reason
from ...spec_decode.rejection import DraftRows
from ...spec_decode.verify import VerifyPlan
from ...structured_output import GrammarCompilerCache, StructuredOutputManager
from ...structured_output.bitmask import StepBitmask
from ...structured_output.jump_forward import CanonicalTokens
from ..arg_utils import EngineArgs
from .beam_coordinator import BeamSearchCoordinator
from .beam_search import BeamSearchRequest
from .errors import StepFailedError
from .messages import AddBeamSearchRequest, AddRequest, RequestDelta
from .registry import RequestRegistry
from .request_state import RequestState, SequenceState
from .setup import build_engine_parts, eos_token_ids
from .startup_gc import paused_gc
from .stats import engine_stats
from .step_outputs import (
    StepDeltas,
    append_sampled,
    build_extras,
    jump_forward,
    prompt_logprob_rows,
    record_prompt_logprobs,
)

_NO_TOKENS = np.empty(0, dtype=np.int64)

__all__ = ["EngineCore"]


class EngineCore:
    """Continuous batching over a paged KV cache, one step at a time.

    Each ``step()`` runs one iteration: the Rust scheduler picks requests and
    tokens (prefill and decode together, within the token budget), the model
    runs them on the paged KV cache, the sampler picks next tokens, and the
    scheduler applies them, freeing finished requests' blocks at once.

    Args:
        args: the engine's arguments.
    Raises:
        ValueError: on invalid arguments, an unknown model, or a KV budget too
            small for one sequence of ``max_model_len`` tokens.
    """

    def __init__(self, args: EngineArgs) -> None:
        self.args = args
        self.device = args.torch_device()
        with paused_gc():  # startup allocates ~10^5 objects: no full collections meanwhile
            parts = build_engine_parts(args)
        self.tokenizer = parts.tokenizer  # the grammars' vocabulary; never decodes
        self.model = parts.model
        self.max_model_len = parts.max_model_len
        self.vocab_size = int(self.model.config.vocab_size)
        self.kv_spec = parts.kv_spec
        self.scheduler = parts.scheduler
        self.runner = parts.executor
        self.kv_events = parts.kv_events  # None: events off, nothing recorded
        self.weight_bytes = parts.weight_bytes
        self.drafter = parts.drafter  # a draft model's proposer, or None
        self.lora = parts.lora  # LoRA (pagedrs.lora): LoRAModelManager, or None
        self.sampler = Sampler(args.seed)
        self.eos_token_ids = eos_token_ids(self.model, self.tokenizer)
        self.structured = StructuredOutputManager(
            GrammarCompilerCache(self.tokenizer, self.vocab_size, self.eos_token_ids or None)
        )
        # Jump-forward decoding of ``jump_forward`` grammars; off with speculation.
        canonical = None if args.speculative_config else CanonicalTokens(self.tokenizer)
        self.canonical = canonical if canonical is not None and canonical.enabled else None
        self.registry = RequestRegistry()
        self.beams = BeamSearchCoordinator(self.scheduler, self.registry)
        self._ids = itertools.count()
        # The batch of the last step (None when it scheduled nothing): the
        # step shape the planner's calibration (plan.calibrate) times.
        self.last_batch: _core.StepBatch | None = None

    # ------------------------------------------------------------------ inputs

    def add_request(self, req: AddRequest) -> None:
        """Queue a sampling request; it joins the next step with room.

        The request comes from a front end's ``InputProcessor``, which checked
        its prompt, priority and parameters; the core trusts them (the Rust
        scheduler's own check of the prompt stays, an invariant that raises
        ``ValueError`` naming a front-end bug if ever hit).

        With ``best_of`` (default ``n``) > 1 the prompt is prefilled once and
        forked into that many sequences sharing its blocks.

        Raises:
            InvalidRequestError: a live request id, or structured outputs whose
                schema, regex or grammar is invalid (compiled here, cached by
                spec). Nothing is queued then.
        """
        params, token_ids = req.params, req.prompt_token_ids
        self.registry.check_new_id(req.request_id)
        grammar = None
        jump = False
        if params.structured_outputs is not None:
            grammar = self.structured.compile(params.structured_outputs)
            jump = params.structured_outputs.jump_forward and self.canonical is not None
        lora_id = add_lora_request(self.lora, req)  # LoRA (pagedrs.lora): 0 for the base model
        stop_ids = list(params.stop_token_ids)
        if not params.ignore_eos:
            stop_ids += self.eos_token_ids
        best_of = params.best_of or params.n
        ids = [next(self._ids) for _ in range(best_of)]
        cache_salt = req.cache_salt
        if params.prompt_logprobs is not None:
            # Cache hits skip the prompt's logits: a unique salt avoids them.
            cache_salt = f"{cache_salt or ''}/prompt-logprobs/{uuid.uuid4()}"
        try:
            self.scheduler.add_request(
                ids[0],
                np.asarray(token_ids, dtype=np.int64),
                params.max_tokens,
                stop_ids,
                min_tokens=params.min_tokens,
                temperature=params.temperature,
                top_p=params.top_p,
                top_k=params.top_k,
                seed=-1 if params.seed is None else params.seed,
                cache_salt=cache_salt,
                child_ids=ids[1:],
                priority=int(req.priority),
                num_speculative_tokens=0 if speculation_off_reason(params) is not None else None,
                lora_id=lora_id,
            )
        except BaseException:
            if self.lora is not None:
                self.lora.release_request(req.request_id)
            raise
        if grammar is not None:
            self.structured.add(ids, grammar, jump)
        self.registry.add(
            RequestState.of_sequences(req.request_id, token_ids, params, ids, stop_ids)
        )

    def add_beam_search_request(self, req: AddBeamSearchRequest) -> None:
        """Queue a beam search request (checked by its front end's
        ``InputProcessor``): its beams are sequences of one group sharing
        blocks, forked and freed as candidates change. Its one delta comes when
        the search is over: the finished hypotheses, best first.

        Raises:
            InvalidRequestError: a live request id, or a LoRA adapter that
                cannot run (as ``add_request``); every beam runs the adapter.
            ValueError: beams that cannot fit together.
        """
        request_id, token_ids, params = req.request_id, req.prompt_token_ids, req.params
        self.registry.check_new_id(request_id)
        self.beams.check_fits(len(token_ids), params, self.args.max_num_seqs, self.max_model_len)
        lora_id = add_lora_request(self.lora, req)  # forks inherit it
        first = next(self._ids)
        try:
            self.scheduler.add_request(
                first,
                np.asarray(token_ids, dtype=np.int64),
                params.max_tokens,
                [],
                temperature=0.0,
                num_speculative_tokens=0,  # beams fork every step: no speculation
                lora_id=lora_id,
            )
        except BaseException:
            if self.lora is not None:
                self.lora.release_request(request_id)
            raise
        beam = BeamSearchRequest(
            request_id,
            token_ids,
            params,
            self.eos_token_ids,
            min(len(token_ids) + params.max_tokens, self.max_model_len),
            first,
            lambda: next(self._ids),
        )
        self.registry.add_beam(beam, first)

    def abort_request(self, request_id: str) -> RequestDelta | None:
        """Abort a request (every sequence); its blocks return to the free pool
        at once. Unknown ids are ignored.

        Returns:
            for a beam search, its final delta (the hypotheses finished so
            far); None otherwise (the front end ends the request's output).
        """
        beam_delta = self.beams.abort(request_id)
        if beam_delta is not None:
            if self.lora is not None:  # LoRA (pagedrs.lora): unpin its adapter
                self.lora.release_request(request_id)
            return beam_delta
        state = self.registry.get(request_id)
        if state is not None:
            for seq in state.seqs:
                if seq.finish_reason is None:
                    self.scheduler.abort(seq.internal_id)
                    seq.finish_reason = "abort"
            self._release(state)
        return None

    def abort_all(self) -> None:
        """Abort every live request (the engine stops)."""
        for request_id in self.registry.request_ids():
            self.abort_request(request_id)

    def stop_sequence(self, request_id: str, index: int, stop_reason: str | None = None) -> None:
        """Finish one sequence of a request with finish_reason "stop" (a stop
        string its front end found); its blocks return to the pool at once. The
        request is released when it was the last one running; unknown ids and
        finished sequences are ignored."""
        state = self.registry.get(request_id)
        if state is None or not 0 <= index < len(state.seqs):
            return
        seq = state.seqs[index]
        if seq.finish_reason is None:
            self.scheduler.stop_request(seq.internal_id)
            seq.finish_reason, seq.stop_reason = "stop", stop_reason
        if state.finished:
            self._release(state)

    def _release(self, state: RequestState) -> None:
        """Forget a finished request and its grammar matchers."""
        self.registry.release(state)
        if self.lora is not None:  # LoRA (pagedrs.lora): unpin its adapter
            self.lora.release_request(state.request_id)
        self.structured.release([seq.internal_id for seq in state.seqs])

    def has_unfinished_requests(self) -> bool:
        """True while any request is waiting or running."""
        return self.scheduler.has_unfinished_requests()

    # -------------------------------------------------------------------- step

    def step(self) -> list[RequestDelta]:
        """Run one iteration.

        Returns:
            a delta for every request that got tokens or finished (finished
            requests are already released): new token ids, logprob entries,
            finish reasons; prompt logprobs, the prefix-cache hit
            (``num_cached_tokens``) and when the request was first scheduled
            (``scheduled_time``: this step's start) with a request's first delta.
        Raises:
            StepFailedError: the step failed; its requests are named and the
                scheduler is consistent (the caller aborts them).
            WorkerDiedError: a tensor-parallel worker is gone.
        """
        start = time.time()
        out = self.scheduler.schedule()
        self.last_batch = None if out is None else out.batch
        if out is None:
            return []
        try:
            return self._run_step(out, start)
        except (WorkerDiedError, KeyboardInterrupt):
            # The engine cannot go on (a dead worker), or the user stopped it:
            # the step is cancelled so that no request stays in flight.
            self.scheduler.cancel_step()
            raise
        except Exception as exc:
            self.scheduler.cancel_step()  # no-op when update() already ran
            ids: list[str] = []
            for seq_id in out.batch.seq_request_ids.tolist():
                rid = self.registry.request_id_of(seq_id)
                if rid is not None and rid not in ids:
                    ids.append(rid)
            raise StepFailedError(f"{type(exc).__name__}: {exc}", ids) from exc
        finally:  # the step's evictions (schedule) and stored blocks (update)
            if self.kv_events is not None:
                self.kv_events.publish(self.scheduler.take_kv_events())

    def _run_step(self, out: _core.SchedulerOutput, start: float) -> list[RequestDelta]:
        """Block moves, model, sampling and deltas of one scheduled step
        (``start``: when it began, seconds since the epoch)."""
        batch, owner = out.batch, self.registry.owner
        if not out.block_moves.is_empty:
            self.runner.apply_block_moves(out.block_moves)
        deltas = StepDeltas()
        if batch.num_tokens == 0:  # a step that only moved blocks
            return self._finish(self.scheduler.update(_NO_TOKENS), deltas, [], [])
        if self.registry.unscheduled:
            self.registry.note_first_schedules(
                batch.seq_request_ids.tolist(),
                batch.query_start_loc.tolist(),
                batch.seq_lens.tolist(),
                start,
            )
        draft_rows = None
        if self.drafter is not None:
            # The draft model's KV of the step's verified tokens, and its
            # tokens in the draft slots the scheduler reserved.
            batch, draft_rows = self.drafter.propose(batch)
            if batch.num_drafts:
                self.scheduler.set_draft_tokens(batch.draft_token_ids)
        prompt_rows = (
            prompt_logprob_rows(batch, owner) if self.registry.num_prompt_logprobs else None
        )
        # The grammar bitmask fills on a worker thread while the forward runs.
        fill = self.structured.start_fill(batch) if len(self.structured) else None
        try:
            logits, prompt_logits = self.runner.execute(batch, prompt_rows)
        finally:
            bitmask = self.structured.finish_fill(fill) if fill is not None else None
        if prompt_rows is not None and prompt_logits is not None:
            record_prompt_logprobs(batch, prompt_rows, prompt_logits, owner)
        if batch.num_drafts:
            return self._verify_step(batch, logits, bitmask, deltas, draft_rows)
        extras = build_extras(batch, owner) if self.registry.num_special else None
        sampled = self.sampler(logits, batch, extras, bitmask)
        tokens = sampled.token_ids
        plans = self.beams.choose_tokens(batch, logits, tokens) if self.registry.beam_of else []
        finished = self.scheduler.update(tokens)
        ends = {f.id: len(f.output_token_ids) for f in finished}
        completed = append_sampled(batch, sampled, owner, self.structured, deltas, ends=ends)
        if self.canonical is not None and self.structured.num_jumping:
            done = set(ends) | {seq.internal_id for seq in completed}
            finished += jump_forward(batch, owner, self, deltas, done)
        beam_deltas = self.beams.apply(plans, {f.id for f in finished}) if plans else []
        return self._finish(finished, deltas, completed, beam_deltas)

    def _verify_step(
        self,
        batch: _core.StepBatch,
        logits: torch.Tensor,
        bitmask: StepBitmask | None,
        deltas: StepDeltas,
        draft_rows: DraftRows | None = None,
    ) -> list[RequestDelta]:
        """Sampling, verification and deltas of a step with draft tokens
        (``spec_decode.verify``): every verified position is sampled as a
        step without speculation would sample it (with a draft model's
        ``draft_rows``, a sampling row's position by the rejection rule,
        ``spec_decode.rejection``), drafts are accepted while they equal
        those samples, and the scheduler gets the accepted counts."""
        owner = self.registry.owner
        plan = VerifyPlan.from_batch(batch)
        extras = build_extras(plan.rows, owner, plan.pending) if self.registry.num_special else None
        sampled = self.sampler(logits, plan.rows, extras, bitmask, draft_rows)
        verified = plan.verify(sampled.token_ids)
        own = verified.own_tokens(batch.num_samples)
        plans = []
        if self.registry.beam_of:  # beam rows have no drafts: their one row is their last
            plans = self.beams.choose_tokens(batch, logits[plan.last_row], own)
        finished = self.scheduler.update(
            verified.update_tokens(own, batch.num_samples), verified.num_accepted
        )
        ends = {f.id: len(f.output_token_ids) for f in finished}
        completed = append_sampled(
            batch, sampled, owner, self.structured, deltas, verified=verified, ends=ends
        )
        beam_deltas = self.beams.apply(plans, {f.id for f in finished}) if plans else []
        return self._finish(finished, deltas, completed, beam_deltas)

    def _finish(
        self,
        finished: list[_core.FinishedRequest],
        deltas: StepDeltas,
        completed: list[SequenceState],
        beam_deltas: list[RequestDelta],
    ) -> list[RequestDelta]:
        """Mark the sequences the scheduler finished, stop those a completed
        grammar ended, release finished requests; the step's deltas."""
        owner = self.registry.owner
        if self.lora is not None:  # LoRA (pagedrs.lora): unpin finished searches' adapters
            for delta in beam_deltas:
                self.lora.release_request(delta.request_id)
        ended = set()
        for f in finished:
            if f.id not in owner:
                continue  # a beam: the beam search owns it
            ended.add(f.id)
            state, seq = owner[f.id]
            if seq.finish_reason is None:
                # As vLLM: stop_reason names a stop token the request asked
                # for, and is None when EOS ended it.
                user_stop = f.stop_token in state.params.stop_token_ids
                stop = f.stop_token if user_stop or f.stop_token not in self.eos_token_ids else None
                seq.finish_reason, seq.stop_reason = f.reason, stop
            deltas.seq(state, seq)
        for seq in completed:
            if seq.internal_id not in ended:
                self.scheduler.stop_request(seq.internal_id)
        out: list[RequestDelta] = []
        for state, delta in deltas.request_deltas():
            out.append(delta)
            if delta.finished:
                self._release(state)
        return out + beam_deltas

    # ------------------------------------------------------------------ engine

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix (vLLM's name; publishes AllBlocksCleared).
        Returns False, changing nothing, while any request holds blocks."""
        done = self.scheduler.reset_prefix_cache()
        if self.kv_events is not None:
            self.kv_events.publish(self.scheduler.take_kv_events())
        return done

    def kv_cache_stats(self) -> dict[str, Any]:
        """Block pool and scheduler counters (keys: ``stats.engine_stats``)."""
        stats = engine_stats(
            self.scheduler, self.kv_spec, self.runner.kv_cache_spec, self.weight_bytes
        )
        if self.lora is not None:  # LoRA (pagedrs.lora): the adapters' bytes
            stats.update(self.lora.stats())
        return stats

    def shutdown(self) -> None:
        """Stop the executor's workers, the grammar thread and the KV event
        publisher, if any (idempotent)."""
        self.structured.close()
        self.runner.close()
        if self.kv_events is not None:
            self.kv_events.close()
