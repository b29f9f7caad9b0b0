"""The step-driven engine: tokenizer + Rust scheduler + executor + sampler.

One ``step()`` is the loop of ARCHITECTURE.md: schedule (Rust) -> apply block
moves and run the model (executor) -> sample -> update (Rust) -> outputs.
Building the parts lives in ``setup``, request bookkeeping in ``registry``,
beam search in ``beam_coordinator`` and ``beam_search``, token-to-text work in
``output_processor``, grammar matchers and bitmasks in ``structured_output``.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import _core
from ..detokenizer import NO_DETOKENIZER, IncrementalDetokenizer
from ..distributed.errors import WorkerDiedError
from ..executor.sampler import Sampler
from ..outputs import RequestMetrics, RequestOutput
from ..sampling_params import BeamSearchParams, SamplingParams
from ..structured_output import GrammarCompilerCache, StructuredOutputManager
from .arg_utils import EngineArgs
from .beam_coordinator import BeamSearchCoordinator
from .beam_search import BeamSearchRequest
from .errors import StepFailedError
from .output_processor import OutputProcessor, build_extras, prompt_logprob_rows
from .registry import RequestRegistry
from .request_state import RequestState, SequenceState
from .setup import build_engine_parts
from .stats import engine_stats
from .validation import check_params, check_priority, check_prompt

_NO_TOKENS = np.empty(0, dtype=np.int64)

__all__ = ["LLMEngine", "StepFailedError"]


class LLMEngine:
    """Continuous-batching engine over a paged KV cache.

    Each ``step()`` runs one iteration: the Rust scheduler picks requests and
    tokens (prefill and decode together, within the token budget), the model
    runs them on the paged KV cache, the sampler picks next tokens, and the
    scheduler applies them, freeing finished requests' blocks at once.

    Raises:
        ValueError: on invalid arguments, an unknown model, or a KV budget too
            small for one sequence of ``max_model_len`` tokens.
    """

    def __init__(self, args: EngineArgs, *, detokenize: bool = True) -> None:
        self.args = args
        self.detokenize = detokenize
        self.device = args.torch_device()
        parts = build_engine_parts(args)
        self.tokenizer = parts.tokenizer
        self.model = parts.model
        self.max_model_len = parts.max_model_len
        self.kv_spec = parts.kv_spec
        self.scheduler = parts.scheduler
        self.runner = parts.executor
        self.kv_events = parts.kv_events  # None: events off, nothing recorded
        self.sampler = Sampler(args.seed)
        self.eos_token_ids = self._eos_token_ids()
        self.structured = StructuredOutputManager(
            GrammarCompilerCache(
                self.tokenizer, self.model.config.vocab_size, self.eos_token_ids or None
            )
        )
        self.output_processor = OutputProcessor(self._decode_token, self.structured)
        self.registry = RequestRegistry()
        self.beams = BeamSearchCoordinator(self.scheduler, self.registry)
        self._ids = itertools.count()

    @classmethod
    def from_engine_args(cls, args: EngineArgs) -> LLMEngine:
        """vLLM's constructor spelling."""
        return cls(args)

    def _decode_token(self, token: int) -> str | None:
        return self.tokenizer.decode([token]) if self.detokenize else None

    def _eos_token_ids(self) -> list[int]:
        eos = getattr(self.model.generation_config, "eos_token_id", None)
        if eos is None:
            eos = self.tokenizer.eos_token_id
        if eos is None:
            return []
        return [eos] if isinstance(eos, int) else list(eos)

    def tokenize(self, prompt: str) -> list[int]:
        """Token ids of ``prompt`` with the tokenizer's special tokens."""
        return list(self.tokenizer(prompt).input_ids)

    def validate_prompt(self, prompt_token_ids: Sequence[int]) -> None:
        """Check a prompt before queuing it.

        Raises:
            ValueError: empty, over ``max_model_len - 1`` tokens, or with ids
                outside the vocabulary.
        """
        check_prompt(prompt_token_ids, self.max_model_len, self.model.config.vocab_size)

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        arrival_time: float | None = None,
        prompt_token_ids: list[int] | None = None,
        cache_salt: str | None = None,
        priority: int = 0,
    ) -> None:
        """Queue a request (text or token ids); it joins the next step with room.

        With ``best_of`` (default ``n``) > 1 the prompt is prefilled once and
        forked into that many sequences sharing its blocks.

        Args:
            request_id: caller's unique id.
            prompt: text, or token ids.
            params: sampling parameters.
            arrival_time: seconds since the epoch (default now).
            prompt_token_ids: the text's tokens when already tokenized.
            cache_salt: per-tenant salt: requests with different salts never
                share prefix-cached blocks.
            priority: lower runs first under ``scheduling_policy="priority"``
                (vLLM's semantics); must be 0 under "fcfs".
        Raises:
            ValueError: duplicate request id, an invalid prompt, a non-zero
                priority without priority scheduling, or structured outputs
                whose schema, regex or grammar is invalid (compiled here,
                cached by spec). Nothing is queued then.
        """
        self.registry.check_new_id(request_id)
        self.check_priority(priority)
        check_params(params, self.args.max_logprobs)
        text = prompt if isinstance(prompt, str) else None
        if prompt_token_ids is not None:
            token_ids = list(prompt_token_ids)
        elif isinstance(prompt, str):
            token_ids = self.tokenize(prompt)
        else:
            token_ids = list(prompt)
        self.validate_prompt(token_ids)
        grammar = None
        if params.structured_outputs is not None:
            grammar = self.structured.compile(params.structured_outputs)
        stop_ids = list(params.stop_token_ids)
        if not params.ignore_eos:
            stop_ids += self.eos_token_ids
        best_of = params.best_of or params.n
        ids = [next(self._ids) for _ in range(best_of)]
        if params.prompt_logprobs is not None:
            # Cache hits skip the prompt's logits: a unique salt avoids them.
            cache_salt = f"{cache_salt or ''}/prompt-logprobs/{uuid.uuid4()}"
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
            priority=int(priority),
        )
        if grammar is not None:
            self.structured.add(ids, grammar)
        stop = list(params.stop or [])
        seqs = [
            SequenceState(
                iid,
                i,
                IncrementalDetokenizer(
                    self.tokenizer,
                    token_ids,
                    params.skip_special_tokens,
                    stop,
                    params.include_stop_str_in_output,
                )
                if self.detokenize
                else NO_DETOKENIZER,
            )
            for i, iid in enumerate(ids)
        ]
        state = RequestState(
            request_id,
            text,
            token_ids,
            params,
            RequestMetrics(arrival_time or time.time()),
            seqs,
            stop_ids,
            prompt_logprobs=[None] if params.prompt_logprobs is not None else None,
            special=(
                params.min_p > 0
                or params.needs_penalties
                or params.min_tokens > 0
                or params.logprobs is not None
                or best_of > params.n
            ),
        )
        self.registry.add(state)

    def check_priority(self, priority: int) -> None:
        """Raise unless ``priority`` is an integer the scheduling policy allows.

        Raises:
            ValueError: as ``validation.check_priority``.
        """
        check_priority(priority, self.args.scheduling_policy)

    def add_beam_search_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: BeamSearchParams,
        prompt_token_ids: list[int] | None = None,
    ) -> None:
        """Queue a beam search request: its beams are sequences of one group
        sharing blocks, forked and freed as candidates change.

        Raises:
            ValueError: duplicate request id, an invalid prompt, or beams that
                cannot fit together.
            TypeError: ``params`` is not ``BeamSearchParams`` (structured
                outputs, which only ``SamplingParams`` carry, are refused).
        """
        if not isinstance(params, BeamSearchParams):
            so = getattr(params, "structured_outputs", None)
            why = "beam search does not support structured outputs; " if so else ""
            raise TypeError(f"{why}params must be BeamSearchParams, got {type(params).__name__}")
        self.registry.check_new_id(request_id)
        text = prompt if isinstance(prompt, str) else None
        if prompt_token_ids is None:
            prompt_token_ids = self.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        token_ids = list(prompt_token_ids)
        self.validate_prompt(token_ids)
        self.beams.check_fits(len(token_ids), params, self.args.max_num_seqs, self.max_model_len)
        first = next(self._ids)
        self.scheduler.add_request(
            first, np.asarray(token_ids, dtype=np.int64), params.max_tokens, [], temperature=0.0
        )
        beam = BeamSearchRequest(
            request_id,
            text,
            token_ids,
            params,
            self.eos_token_ids,
            min(len(token_ids) + params.max_tokens, self.max_model_len),
            first,
            lambda: next(self._ids),
            lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True),
            RequestMetrics(time.time()),
        )
        self.registry.add_beam(beam, first)

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Abort a request (every sequence); its blocks return to the free pool
        at once. Returns its output with finish_reason "abort", or None if unknown.
        """
        beam_output = self.beams.abort(request_id)
        if beam_output is not None:
            return beam_output
        state = self.registry.get(request_id)
        if state is None:
            return None
        for seq in state.seqs:
            if seq.finish_reason is None:
                self.scheduler.abort(seq.internal_id)
                seq.finish_reason = "abort"
        return self._release(state)

    def _release(self, state: RequestState) -> RequestOutput:
        """Forget a finished request (and its grammar matchers); return its final output."""
        self.registry.release(state)
        self.structured.release([seq.internal_id for seq in state.seqs])
        state.metrics.finished_time = time.time()
        return state.output()

    def has_unfinished_requests(self) -> bool:
        """True while any request is waiting or running."""
        return self.scheduler.has_unfinished_requests()

    def step(self) -> list[RequestOutput]:
        """Run one iteration.

        Returns:
            an output for every request that got new tokens (``finished`` set
            on the last one); unfinished outputs carry the text that is safe to
            stream so far (never part of a possible stop string).
        Raises:
            StepFailedError: the step failed; its requests are named and the
                scheduler is consistent (the caller aborts them).
            WorkerDiedError: a tensor-parallel worker is gone.
        """
        states, beam_outputs = self._step()
        return [self._release(st) if st.finished else st.output() for st in states] + beam_outputs

    def step_states(self) -> list[RequestState]:
        """Run one iteration and return the state of every request that got new
        tokens or finished, without building outputs (the engine core ships
        deltas of these); finished ones are already released. Beam search
        requests are not served this way.

        Raises:
            StepFailedError, WorkerDiedError: as ``step``.
        """
        states, _ = self._step()
        for st in states:
            if st.finished:
                self._release(st)
        return states

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

    def _step(self) -> tuple[list[RequestState], list[RequestOutput]]:
        """One iteration: the touched request states and beam search outputs."""
        out = self.scheduler.schedule()
        if out is None:
            return [], []
        try:
            return self._run_step(out)
        except WorkerDiedError:
            self.scheduler.cancel_step()
            raise  # the engine cannot go on: not one request's failure
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

    def _run_step(
        self, out: _core.SchedulerOutput
    ) -> tuple[list[RequestState], list[RequestOutput]]:
        """Block moves, model, sampling and outputs of one scheduled step."""
        batch, owner = out.batch, self.registry.owner
        if not out.block_moves.is_empty:
            self.runner.apply_block_moves(out.block_moves)
        if batch.num_tokens == 0:  # a step that only moved blocks
            return self._finish_sequences(self.scheduler.update(_NO_TOKENS), []), []
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
            self.output_processor.prompt_logprobs(batch, prompt_rows, prompt_logits, owner)
        extras = build_extras(batch, owner) if self.registry.num_special else None
        sampled = self.sampler(logits, batch, extras, bitmask)
        tokens = sampled.token_ids
        plans = self.beams.choose_tokens(batch, logits, tokens) if self.registry.beam_of else []
        finished = self.scheduler.update(tokens)
        now = time.time()
        for rid in batch.sample_request_ids[batch.num_output_tokens == 0].tolist():
            if rid in owner:
                owner[rid][0].metrics.first_token_time = now
        touched, stopped = self.output_processor.apply(batch, sampled, owner)
        beam_outputs = self.beams.apply(plans, {f.id for f in finished}) if plans else []
        finished = [f for f in finished if f.id in owner]
        return self._finish_sequences(finished, touched, stopped), beam_outputs

    def _finish_sequences(
        self,
        finished: list[_core.FinishedRequest],
        touched: list[RequestState],
        stopped: list[SequenceState] | None = None,
    ) -> list[RequestState]:
        """Mark sequences the scheduler finished, tell it about stop strings,
        advance the streamed text; returns the step's touched requests."""
        touched_ids = {st.request_id for st in touched}
        ended = set()
        for f in finished:
            ended.add(f.id)
            state, seq = self.registry.owner[f.id]
            if seq.finish_reason is None:
                # As vLLM: stop_reason names a stop token the request asked
                # for, and is None when EOS ended it.
                user_stop = f.stop_token in state.params.stop_token_ids
                stop = f.stop_token if user_stop or f.stop_token not in self.eos_token_ids else None
                seq.finish_reason, seq.stop_reason = f.reason, stop
            if state.request_id not in touched_ids:
                touched.append(state)
                touched_ids.add(state.request_id)
        for seq in stopped or []:
            if seq.internal_id not in ended:
                self.scheduler.stop_request(seq.internal_id)
        for state in touched:
            for seq in state.seqs:
                if seq.token_ids or seq.finish_reason is not None:
                    done = seq.finish_reason is not None
                    seq.streamed_text += seq.detok.next_delta(finished=done)
        return touched

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix (vLLM's name; publishes AllBlocksCleared).
        Returns False, changing nothing, while any request holds blocks."""
        done = self.scheduler.reset_prefix_cache()
        if self.kv_events is not None:
            self.kv_events.publish(self.scheduler.take_kv_events())
        return done

    def kv_cache_stats(self) -> dict[str, Any]:
        """Block pool and scheduler counters (keys: ``stats.engine_stats``)."""
        return engine_stats(self.scheduler, self.kv_spec, self.runner.kv_cache_spec)

    def shutdown(self) -> None:
        """Stop the executor's workers, the grammar thread and the KV event
        publisher, if any (idempotent)."""
        self.structured.close()
        self.runner.close()
        if self.kv_events is not None:
            self.kv_events.close()
