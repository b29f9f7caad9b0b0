"""``LLMEngine``: the offline front end over an engine core in this process.

It validates and tokenizes requests, hands them to its ``EngineCore`` (direct
calls: no copy, no serialization) and turns each step's token-id deltas into
``RequestOutput`` objects with its ``OutputProcessor`` (detokenization, stop
strings, logprob texts, best_of ranking). A stop string found there stops its
sequence in the core before the next step.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from ..lora.request import LoRARequest
from ..outputs import RequestOutput
from ..sampling_params import BeamSearchParams, SamplingParams
from .arg_utils import EngineArgs
from .core.engine_core import EngineCore
from .core.messages import AddRequest
from .errors import StepFailedError
from .output_processor import OutputProcessor
from .validation import check_params, check_priority, check_prompt

__all__ = ["LLMEngine", "StepFailedError"]


class LLMEngine:
    """Continuous-batching engine over a paged KV cache, stepped by its caller.

    Args:
        args: the engine's arguments.

    Attributes:
        engine_core: the ``EngineCore`` (scheduler, executor, sampler, beam
            search, grammars) this front end drives.
        tokenizer: the HF tokenizer.
        max_model_len: the context length, in tokens.

    Raises:
        ValueError: on invalid arguments, an unknown model, or a KV budget too
            small for one sequence of ``max_model_len`` tokens.
    """

    def __init__(self, args: EngineArgs) -> None:
        self.args = args
        self.engine_core = EngineCore(args)
        self.tokenizer = self.engine_core.tokenizer
        self.max_model_len = self.engine_core.max_model_len
        self.output_processor = OutputProcessor(self.tokenizer)

    @classmethod
    def from_engine_args(cls, args: EngineArgs) -> LLMEngine:
        """vLLM's constructor spelling."""
        return cls(args)

    def tokenize(self, prompt: str) -> list[int]:
        """Token ids of ``prompt`` with the tokenizer's special tokens."""
        return list(self.tokenizer(prompt).input_ids)

    def validate_prompt(self, prompt_token_ids: Sequence[int]) -> None:
        """Check a prompt before queuing it.

        Raises:
            InvalidRequestError: empty, over ``max_model_len - 1`` tokens, or
                with ids outside the vocabulary.
        """
        check_prompt(prompt_token_ids, self.max_model_len, self.engine_core.vocab_size)

    def check_priority(self, priority: int) -> None:
        """Raise unless ``priority`` is an integer the scheduling policy allows.

        Raises:
            InvalidRequestError: as ``validation.check_priority``.
        """
        check_priority(priority, self.args.scheduling_policy)

    def _prompt_ids(self, prompt: str | list[int], prompt_token_ids: list[int] | None) -> list[int]:
        if prompt_token_ids is not None:
            return list(prompt_token_ids)
        return self.tokenize(prompt) if isinstance(prompt, str) else list(prompt)

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        arrival_time: float | None = None,
        prompt_token_ids: list[int] | None = None,
        cache_salt: str | None = None,
        priority: int = 0,
        lora_request: LoRARequest | None = None,
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
            lora_request: the LoRA adapter it runs with (``enable_lora``), or
                None for the base model.
        Raises:
            InvalidRequestError: a duplicate request id, an invalid prompt, a
                LoRA adapter that cannot be loaded or does not fit (param
                ``model``, naming the file, field or tensor), a
                non-zero priority without priority scheduling, or structured
                outputs whose schema, regex or grammar is invalid (compiled in
                the core, cached by spec). Nothing is queued then.
            TypeError: ``params`` is not ``SamplingParams``.
        """
        self.output_processor.check_new_id(request_id)
        check_priority(priority, self.args.scheduling_policy)
        check_params(params, self.args.max_logprobs)
        token_ids = self._prompt_ids(prompt, prompt_token_ids)
        self.validate_prompt(token_ids)
        arrival = arrival_time or time.time()
        # The output state first: invalid stop strings refuse the request here.
        text = prompt if isinstance(prompt, str) else None
        self.output_processor.add(request_id, request_id, text, token_ids, params, arrival)
        try:
            self.engine_core.add_request(
                AddRequest(
                    request_id, token_ids, params, arrival, cache_salt, priority, lora_request
                )
            )
        except BaseException:
            self.output_processor.states.pop(request_id, None)
            raise

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
            InvalidRequestError: duplicate request id, an invalid prompt, or
                beams that cannot fit together.
            TypeError: ``params`` is not ``BeamSearchParams`` (structured
                outputs, which only ``SamplingParams`` carry, are refused).
        """
        self.output_processor.check_new_id(request_id)
        token_ids = self._prompt_ids(prompt, prompt_token_ids)
        self.engine_core.add_beam_search_request(request_id, token_ids, params)
        text = prompt if isinstance(prompt, str) else None
        self.output_processor.add_beam_search(request_id, request_id, text, token_ids, time.time())

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Abort a request (every sequence); its blocks return to the free pool
        at once. Returns its output with finish_reason "abort" (a beam search:
        its hypotheses finished so far), or None if unknown.
        """
        delta = self.engine_core.abort_request(request_id)
        if delta is not None:
            outputs = self.output_processor.apply([delta]).outputs
            return outputs[0][1] if outputs else None
        return self.output_processor.finish(request_id)

    def has_unfinished_requests(self) -> bool:
        """True while any request is waiting or running."""
        return self.engine_core.has_unfinished_requests()

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
        result = self.output_processor.apply(self.engine_core.step())
        for request_id, index, stop in result.stops:
            self.engine_core.stop_sequence(request_id, index, stop)
        return [out for _, out in result.outputs]

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix (vLLM's name; publishes AllBlocksCleared).
        Returns False, changing nothing, while any request holds blocks."""
        return self.engine_core.reset_prefix_cache()

    def kv_cache_stats(self) -> dict[str, Any]:
        """Block pool and scheduler counters (keys: ``stats.engine_stats``)."""
        return self.engine_core.kv_cache_stats()

    def shutdown(self) -> None:
        """Stop the executor's workers, the grammar thread and the KV event
        publisher, if any (idempotent)."""
        self.engine_core.shutdown()
