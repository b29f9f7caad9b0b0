"""The step-driven engine: tokenizer + Rust scheduler + model runner + sampler."""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import _core
from ..executor.kv_cache import KVCacheSpec
from ..executor.model_loader import load_model, load_tokenizer
from ..executor.model_runner import ModelRunner
from ..executor.sampler import Sampler
from ..outputs import CompletionOutput, RequestMetrics, RequestOutput
from ..sampling_params import SamplingParams
from .arg_utils import EngineArgs

DEFAULT_KV_CACHE_BYTES = 4 << 30


@dataclass
class _RequestState:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    metrics: RequestMetrics


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
        )
        self.runner = ModelRunner(
            self.model,
            self.kv_spec,
            num_blocks,
            self.device,
            use_triton=args.use_triton(),
            num_cpu_blocks=num_cpu_blocks,
        )
        self.sampler = Sampler(args.seed)
        self.eos_token_ids = self._eos_token_ids()
        self._ids = itertools.count()
        self._requests: dict[int, _RequestState] = {}
        self._by_name: dict[str, int] = {}

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
        if request_id in self._by_name:
            raise ValueError(f"request id {request_id!r} is already in use")
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
        internal = next(self._ids)
        self.scheduler.add_request(
            internal,
            np.asarray(token_ids, dtype=np.int64),
            params.max_tokens,
            stop_ids,
            min_tokens=params.min_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k,
            seed=-1 if params.seed is None else params.seed,
            cache_salt=cache_salt,
        )
        self._requests[internal] = _RequestState(
            request_id, text, token_ids, params, RequestMetrics(arrival_time or time.time())
        )
        self._by_name[request_id] = internal

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Abort a request; its blocks return to the free pool at once.

        Returns its output with finish_reason "abort", or None if unknown.
        """
        internal = self._by_name.get(request_id)
        if internal is None:
            return None
        done = self.scheduler.abort(internal)
        return self._finish(*done) if done is not None else None

    def has_unfinished_requests(self) -> bool:
        """True while any request is waiting or running."""
        return self.scheduler.has_unfinished_requests()

    def step(self) -> list[RequestOutput]:
        """Run one iteration; return the requests that finished in it."""
        step = self.scheduler.schedule()
        if step is None:
            return []
        self.runner.apply_block_moves(step)
        if len(step["input_ids"]) == 0:  # a step that only swapped blocks
            return [self._finish(*f) for f in self.scheduler.update(step["logits_indices"])]
        logits = self.runner.execute(step)
        tokens = self.sampler(logits, step)
        now = time.time()
        for rid in step["request_ids"][step["num_output_tokens"] == 0]:
            self._requests[int(rid)].metrics.first_token_time = now
        return [self._finish(*f) for f in self.scheduler.update(tokens)]

    def _finish(
        self, internal: int, reason: str, stop_token: int | None, token_ids: np.ndarray
    ) -> RequestOutput:
        state = self._requests.pop(internal)
        del self._by_name[state.request_id]
        state.metrics.finished_time = time.time()
        ids = token_ids.tolist()
        text = self.tokenizer.decode(ids, skip_special_tokens=state.params.skip_special_tokens)
        completion = CompletionOutput(0, text, ids, reason, stop_token)
        return RequestOutput(
            state.request_id,
            state.prompt,
            state.prompt_token_ids,
            [completion],
            True,
            state.metrics,
        )

    def kv_cache_stats(self) -> dict[str, Any]:
        """Block pool and scheduler counters.

        Keys: num_total_blocks, num_free_blocks, num_used_blocks,
        num_cached_blocks, num_evicted_blocks, num_cpu_blocks,
        num_free_cpu_blocks, num_preemptions, num_swapped_out, num_swapped_in
        (blocks), prefix_cache_queries, prefix_cache_hits (tokens), num_waiting,
        num_running, num_swapped, num_steps, block_size, num_token_states,
        num_allocated_slots, kv_cache_utilization (token states / allocated
        slots), bytes_per_block.
        """
        stats = dict(self.scheduler.stats())
        stats["bytes_per_block"] = self.kv_spec.bytes_per_block
        return stats
