"""The step-driven engine: tokenizer + Rust scheduler + model runner + sampler."""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import _core
from ..detokenizer import IncrementalDetokenizer
from ..distributed.tp_runner import TensorParallelRunner, WorkerDiedError
from ..executor.kv_cache import KVCacheSpec
from ..executor.model_loader import load_model, load_tokenizer
from ..executor.model_runner import ModelRunner
from ..executor.sampler import Sampler
from ..outputs import RequestMetrics, RequestOutput
from ..sampling_params import BeamSearchParams, SamplingParams
from .arg_utils import EngineArgs
from .beam_search import BeamSearchRequest
from .output_processor import OutputProcessor, build_extras
from .request_state import RequestState, SequenceState

DEFAULT_KV_CACHE_BYTES = 4 << 30


class StepFailedError(RuntimeError):
    """A step raised inside the model loop; the scheduler is left consistent.

    Attributes:
        request_ids: the requests that were in the failed step (the caller
            aborts them; every other request is unaffected).
    """

    def __init__(self, message: str, request_ids: list[str]) -> None:
        super().__init__(message)
        self.request_ids = request_ids


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

    def __init__(self, args: EngineArgs) -> None:
        self.args = args
        self.device = args.torch_device()
        dtype = args.torch_dtype()
        self.tokenizer = load_tokenizer(args.model, args.tokenizer)
        self.model = load_model(args.model, dtype, self.device)
        config = self.model.config
        model_max = getattr(config, "max_position_embeddings", None) or 2048
        if args.max_model_len is not None and args.max_model_len > model_max:
            raise ValueError(
                f"max_model_len={args.max_model_len} exceeds the model's {model_max} positions"
            )
        self.max_model_len = args.max_model_len or model_max
        self.kv_spec = KVCacheSpec.from_config(config, args.block_size, dtype)
        if args.num_gpu_blocks_override is not None:
            num_blocks = args.num_gpu_blocks_override
        else:
            num_blocks = self.kv_spec.num_blocks(
                args.kv_cache_memory_bytes or DEFAULT_KV_CACHE_BYTES
            )
        num_cpu_blocks = 0
        if args.preemption_mode == "swap":
            num_cpu_blocks = int(args.swap_space * (1 << 30)) // self.kv_spec.bytes_per_block
        budget = args.max_num_batched_tokens or (
            2048 if args.enable_chunked_prefill else self.max_model_len
        )
        self.scheduler = _core.Scheduler(
            num_blocks,
            args.block_size,
            args.max_num_seqs,
            budget,
            self.max_model_len,
            enable_chunked_prefill=args.enable_chunked_prefill,
            enable_prefix_caching=args.enable_prefix_caching,
            num_cpu_blocks=num_cpu_blocks,
            preemption_mode=args.preemption_mode,
            allocation_policy=args.allocation_policy,
        )
        self.runner: ModelRunner | TensorParallelRunner
        if args.tensor_parallel_size > 1:
            self.runner = TensorParallelRunner(
                args.model,
                self.model,
                dtype,
                self.device,
                args.block_size,
                num_blocks,
                num_cpu_blocks,
                args.use_triton(),
                args.tensor_parallel_size,
            )
        else:
            self.runner = ModelRunner(
                self.model,
                self.kv_spec,
                num_blocks,
                self.device,
                use_triton=args.use_triton(),
                num_cpu_blocks=num_cpu_blocks,
                model_impl=args.model_impl,
                max_model_len=self.max_model_len,
                torch_attention=args.attention_backend == "torch",
            )
        self.sampler = Sampler(args.seed)
        self.eos_token_ids = self._eos_token_ids()
        self.output_processor = OutputProcessor(self._decode_token)
        self._ids = itertools.count()
        self._owner: dict[int, tuple[RequestState, SequenceState]] = {}
        self._requests: dict[str, RequestState] = {}
        # Live requests needing sampler extras / prompt logprobs: the per-row
        # work is skipped on steps where none is live.
        self._num_special = 0
        self._num_prompt_logprobs = 0
        self._beam_requests: dict[str, BeamSearchRequest] = {}
        self._beam_of: dict[int, BeamSearchRequest] = {}

    def _decode_token(self, token: int) -> str:
        return self.tokenizer.decode([token])

    @classmethod
    def from_engine_args(cls, args: EngineArgs) -> LLMEngine:
        """vLLM's constructor spelling."""
        return cls(args)

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
        n = len(prompt_token_ids)
        if n == 0:
            raise ValueError("prompt is empty: it must contain at least one token")
        if n >= self.max_model_len:
            raise ValueError(
                f"prompt has {n} tokens, but max_model_len is {self.max_model_len}: "
                "the prompt plus at least one generated token must fit"
            )
        vocab = self.model.config.vocab_size
        if min(prompt_token_ids) < 0 or max(prompt_token_ids) >= vocab:
            raise ValueError(f"prompt token ids must be in [0, {vocab})")

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        arrival_time: float | None = None,
        prompt_token_ids: list[int] | None = None,
        cache_salt: str | None = None,
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
        Raises:
            ValueError: duplicate request id or an invalid prompt.
        """
        if request_id in self._requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be SamplingParams, got {type(params).__name__}")
        for name in ("logprobs", "prompt_logprobs"):
            k = getattr(params, name)
            if k is not None and k > self.args.max_logprobs:
                raise ValueError(f"{name}={k} exceeds max_logprobs={self.args.max_logprobs}")
        text = prompt if isinstance(prompt, str) else None
        if prompt_token_ids is not None:
            token_ids = list(prompt_token_ids)
        elif isinstance(prompt, str):
            token_ids = self.tokenize(prompt)
        else:
            token_ids = list(prompt)
        self.validate_prompt(token_ids)
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
        )
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
                ),
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
        self._requests[request_id] = state
        self._num_special += state.special
        self._num_prompt_logprobs += state.prompt_logprobs is not None
        for seq in seqs:
            self._owner[seq.internal_id] = (state, seq)

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
            ValueError: duplicate request id or an invalid prompt.
        """
        if request_id in self._requests or request_id in self._beam_requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        text = prompt if isinstance(prompt, str) else None
        if prompt_token_ids is None:
            prompt_token_ids = self.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        token_ids = list(prompt_token_ids)
        self.validate_prompt(token_ids)
        self._check_beams_fit(len(token_ids), params)
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
        self._beam_requests[request_id] = beam
        self._beam_of[first] = beam

    def _check_beams_fit(self, prompt_len: int, params: BeamSearchParams) -> None:
        """All beams of a request run together, so they must fit together.

        Raises:
            ValueError: beam_width over max_num_seqs, or beams of full length
                needing more blocks than the whole KV cache.
        """
        if params.beam_width > self.args.max_num_seqs:
            raise ValueError(
                f"beam_width={params.beam_width} exceeds max_num_seqs={self.args.max_num_seqs}"
            )
        stats = self.scheduler.stats()
        bs = stats["block_size"]
        length = min(prompt_len + params.max_tokens, self.max_model_len)
        need = params.beam_width * -(-length // bs)
        if need > stats["num_total_blocks"]:
            raise ValueError(
                f"beam search needs up to {need} KV blocks ({params.beam_width} beams x "
                f"{length} tokens), but the KV cache has {stats['num_total_blocks']}"
            )

    def _beam_step(
        self, step: dict[str, np.ndarray], logits: Any, tokens: np.ndarray
    ) -> list[tuple[BeamSearchRequest, Any]]:
        """Choose the beam groups' tokens (written into ``tokens``); a group not
        wholly in this step holds (its rows run again next step)."""
        rows: dict[int, int] = {}
        for r, rid in enumerate(step["request_ids"].tolist()):
            if rid in self._beam_of:
                rows[rid] = r
        plans = []
        for beam in {id(b): b for b in (self._beam_of[i] for i in rows)}.values():
            ids = beam.seq_ids()
            if not all(i in rows for i in ids):
                for i in ids:
                    if i in rows:
                        tokens[rows[i]] = _core.HOLD_TOKEN
                continue
            idx = [rows[i] for i in ids]
            plan = beam.step(logits[idx].float().log_softmax(dim=-1))
            for i in ids:
                tokens[rows[i]] = plan.tokens.get(i, 0)
            plans.append((beam, plan))
        return plans

    def _apply_beam_plans(
        self, plans: list[tuple[BeamSearchRequest, Any]], ended: set[int]
    ) -> list[RequestOutput]:
        outputs = []
        for beam, plan in plans:
            for parent, child, token in plan.forks:
                self.scheduler.fork(parent, child, token)
                self._beam_of[child] = beam
            for seq in plan.frees:
                if seq not in ended:
                    self.scheduler.stop_request(seq)
                self._beam_of.pop(seq, None)
            if plan.done:
                del self._beam_requests[beam.request_id]
                beam.metrics.finished_time = time.time()
                outputs.append(beam.output())
        return outputs

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Abort a request (every sequence); its blocks return to the free pool
        at once. Returns its output with finish_reason "abort", or None if unknown.
        """
        beam = self._beam_requests.pop(request_id, None)
        if beam is not None:
            for seq in beam.seq_ids():
                self.scheduler.abort(seq)
                self._beam_of.pop(seq, None)
            return beam.output()
        state = self._requests.get(request_id)
        if state is None:
            return None
        for seq in state.seqs:
            if seq.finish_reason is None:
                self.scheduler.abort(seq.internal_id)
                seq.finish_reason = "abort"
        return self._release(state)

    def _release(self, state: RequestState) -> RequestOutput:
        """Forget a finished request and return its final output."""
        del self._requests[state.request_id]
        self._num_special -= state.special
        self._num_prompt_logprobs -= state.prompt_logprobs is not None
        for seq in state.seqs:
            self._owner.pop(seq.internal_id, None)
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
        """
        step = self.scheduler.schedule()
        if step is None:
            return []
        try:
            return self._run_step(step)
        except WorkerDiedError:
            self.scheduler.cancel_step()
            raise  # the engine cannot go on: not one request's failure
        except Exception as exc:
            self.scheduler.cancel_step()  # no-op when update() already ran
            ids: list[str] = []
            for iid in step["seq_request_ids"].tolist():
                owner = self._owner.get(iid)
                rid = (
                    owner[0].request_id
                    if owner
                    else getattr(self._beam_of.get(iid), "request_id", None)
                )
                if rid is not None and rid not in ids:
                    ids.append(rid)
            raise StepFailedError(f"{type(exc).__name__}: {exc}", ids) from exc

    def _run_step(self, step: dict[str, np.ndarray]) -> list[RequestOutput]:
        """Model, sampling and outputs of one scheduled step."""
        self.runner.apply_block_moves(step)
        if len(step["input_ids"]) == 0:  # a step that only moved blocks
            return self._finish_sequences(self.scheduler.update(step["logits_indices"]), [])
        prompt_rows = self._prompt_logprob_rows(step)
        logits, prompt_logits = self.runner.execute(step, prompt_rows)
        if prompt_rows is not None and prompt_logits is not None:
            self.output_processor.prompt_logprobs(step, prompt_rows, prompt_logits, self._owner)
        extras = build_extras(step, self._owner) if self._num_special else None
        sampled = self.sampler(logits, step, extras)
        tokens = sampled.token_ids
        plans = self._beam_step(step, logits, tokens) if self._beam_of else []
        finished = self.scheduler.update(tokens)
        now = time.time()
        for rid in step["request_ids"][step["num_output_tokens"] == 0].tolist():
            if rid in self._owner:
                self._owner[rid][0].metrics.first_token_time = now
        touched, stopped = self.output_processor.apply(step, sampled, self._owner)
        beam_outputs = self._apply_beam_plans(plans, {f[0] for f in finished}) if plans else []
        finished = [f for f in finished if f[0] in self._owner]
        return self._finish_sequences(finished, touched, stopped) + beam_outputs

    def _prompt_logprob_rows(self, step: dict[str, np.ndarray]) -> np.ndarray | None:
        """Token rows whose logits give prompt logprobs (None when none)."""
        if not self._num_prompt_logprobs:
            return None
        qsl = step["query_start_loc"]
        rows = []
        for s, rid in enumerate(step["seq_request_ids"].tolist()):
            if rid not in self._owner:
                continue
            state, seq = self._owner[rid]
            if state.prompt_logprobs is not None and seq.index == 0 and not seq.token_ids:
                rows.append(np.arange(qsl[s], qsl[s + 1]))
        return np.concatenate(rows) if rows else None

    def _finish_sequences(
        self,
        finished: list[tuple[int, str, int | None, np.ndarray]],
        touched: list[RequestState],
        stopped: list[SequenceState] | None = None,
    ) -> list[RequestOutput]:
        """Mark sequences the scheduler finished, tell it about stop strings,
        and build the step's outputs."""
        touched_ids = {st.request_id for st in touched}
        ended = set()
        for iid, reason, stop_token, _ in finished:
            ended.add(iid)
            state, seq = self._owner[iid]
            if seq.finish_reason is None:
                seq.finish_reason, seq.stop_reason = reason, stop_token
            if state.request_id not in touched_ids:
                touched.append(state)
                touched_ids.add(state.request_id)
        for seq in stopped or []:
            if seq.internal_id not in ended:
                self.scheduler.stop_request(seq.internal_id)
        outputs = []
        for state in touched:
            for seq in state.seqs:
                if seq.token_ids or seq.finish_reason is not None:
                    done = seq.finish_reason is not None
                    seq.streamed_text += seq.detok.next_delta(finished=done)
            outputs.append(self._release(state) if state.finished else state.output())
        return outputs

    def kv_cache_stats(self) -> dict[str, Any]:
        """Block pool and scheduler counters.

        Keys: num_total_blocks, num_free_blocks, num_used_blocks,
        num_cached_blocks, num_evicted_blocks, num_cpu_blocks,
        num_free_cpu_blocks, num_preemptions, num_swapped_out, num_swapped_in
        (blocks), prefix_cache_queries, prefix_cache_hits (tokens), num_waiting,
        num_running, num_swapped, num_steps, block_size, num_token_states,
        num_allocated_slots, kv_cache_utilization (token states / allocated
        slots), bytes_per_block (all ranks), kv_cache_bytes_per_worker (the KV
        tensors one rank holds).
        """
        stats = dict(self.scheduler.stats())
        stats["bytes_per_block"] = self.kv_spec.bytes_per_block
        per_worker = self.runner.spec.bytes_per_block * stats["num_total_blocks"]
        stats["kv_cache_bytes_per_worker"] = per_worker
        return stats

    def shutdown(self) -> None:
        """Stop tensor-parallel workers, if any (idempotent)."""
        if isinstance(self.runner, TensorParallelRunner):
            self.runner.close()
