"""``LLMEngine``: the offline front end over an engine core in this process.

Its ``InputProcessor`` turns prompts into requests (tokenized, validated once);
its ``InProcessCoreClient`` hands them to the ``EngineCore`` (direct calls: no
copy, no serialization); its ``OutputProcessor`` turns each step's token-id
deltas into ``RequestOutput`` objects (detokenization, stop strings, logprob
texts, best_of ranking). A stop string found there stops its sequence in the
core before the next step.
"""

from __future__ import annotations

from typing import Any

from ..inputs import PromptType, TokensPrompt
from ..lora.request import LoRARequest
from ..outputs import RequestOutput
from ..sampling_params import BeamSearchParams, SamplingParams
from .arg_utils import EngineArgs
from .core.engine_core import EngineCore
from .core.errors import StepFailedError
from .core.messages import AddBeamSearchRequest, AddRequest
from .core_client import InProcessCoreClient, make_core_client
from .input_processor import InputProcessor, ProcessedPrompt
from .output_processor import OutputProcessor

__all__ = ["LLMEngine", "StepFailedError"]


class LLMEngine:
    """Continuous-batching engine over a paged KV cache, stepped by its caller.

    Args:
        args: the engine's arguments.

    Attributes:
        core_client: the ``InProcessCoreClient`` every core call goes through.
        input_processor: prompts to validated requests.
        tokenizer: the HF tokenizer.
        max_model_len: the context length, in tokens.

    Raises:
        ValueError: on invalid arguments, an unknown model, or a KV budget too
            small for one sequence of ``max_model_len`` tokens.
    """

    def __init__(self, args: EngineArgs) -> None:
        self.args = args
        client = make_core_client(args, "in_process")
        assert isinstance(client, InProcessCoreClient)
        self.core_client = client
        self.tokenizer = client.core.tokenizer
        self.max_model_len = client.ready.max_model_len
        self.input_processor = InputProcessor(
            self.tokenizer,
            self.max_model_len,
            client.ready.vocab_size,
            args.max_logprobs,
            args.scheduling_policy,
        )
        self.output_processor = OutputProcessor(self.tokenizer)

    @classmethod
    def from_engine_args(cls, args: EngineArgs) -> LLMEngine:
        """vLLM's constructor spelling."""
        return cls(args)

    @property
    def engine_core(self) -> EngineCore:
        """The ``EngineCore`` behind the client (for inspection: its model,
        scheduler, runner; requests go through ``core_client``)."""
        return self.core_client.core

    def tokenize(self, prompt: str) -> list[int]:
        """Token ids of ``prompt`` with the tokenizer's special tokens."""
        return self.input_processor.tokenize(prompt)

    def add_request(
        self,
        request_id: str,
        prompt: PromptType | ProcessedPrompt,
        params: SamplingParams,
        arrival_time: float | None = None,
        prompt_token_ids: list[int] | None = None,
        cache_salt: str | None = None,
        priority: int = 0,
        lora_request: LoRARequest | None = None,
    ) -> None:
        """Queue a request; it joins the next step with room.

        With ``best_of`` (default ``n``) > 1 the prompt is prefilled once and
        forked into that many sequences sharing its blocks.

        Args:
            request_id: caller's unique id.
            prompt: text, token ids, a prompt dict, or a ``ProcessedPrompt``
                from ``input_processor`` (not validated again).
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
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be SamplingParams, got {type(params).__name__}")
        self._add(
            request_id,
            prompt,
            params,
            prompt_token_ids,
            arrival_time,
            cache_salt,
            priority,
            lora_request,
        )

    def add_beam_search_request(
        self,
        request_id: str,
        prompt: PromptType | ProcessedPrompt,
        params: BeamSearchParams,
        prompt_token_ids: list[int] | None = None,
        lora_request: LoRARequest | None = None,
    ) -> None:
        """Queue a beam search request: its beams are sequences of one group
        sharing blocks, forked and freed as candidates change; every beam
        runs ``lora_request``'s adapter (``enable_lora``), if any.

        Raises:
            InvalidRequestError: duplicate request id, an invalid prompt,
                beams that cannot fit together, or a LoRA adapter that cannot
                be loaded or does not fit (param ``model``).
            TypeError: ``params`` is not ``BeamSearchParams`` (structured
                outputs, which only ``SamplingParams`` carry, are refused).
        """
        if not isinstance(params, BeamSearchParams):
            so = getattr(params, "structured_outputs", None)
            why = "beam search does not support structured outputs; " if so else ""
            raise TypeError(f"{why}params must be BeamSearchParams, got {type(params).__name__}")
        self._add(request_id, prompt, params, prompt_token_ids, None, None, 0, lora_request)

    def _add(
        self,
        request_id: str,
        prompt: PromptType | ProcessedPrompt,
        params: SamplingParams | BeamSearchParams,
        prompt_token_ids: list[int] | None,
        arrival_time: float | None,
        cache_salt: str | None,
        priority: int,
        lora_request: LoRARequest | None,
    ) -> None:
        self.output_processor.check_new_id(request_id)
        if prompt_token_ids is not None and not isinstance(prompt, ProcessedPrompt):
            tokens: TokensPrompt = {"prompt_token_ids": list(prompt_token_ids)}
            if isinstance(prompt, str):
                tokens["prompt"] = prompt
            prompt = tokens
        processed = self.input_processor.prompt(prompt)
        req = self.input_processor.request(
            request_id,
            processed,
            params,
            arrival_time=arrival_time,
            cache_salt=cache_salt,
            priority=priority,
            lora_request=lora_request,
        )
        self.enqueue(req, processed.text)

    def enqueue(self, req: AddRequest | AddBeamSearchRequest, prompt_text: str | None) -> None:
        """Queue a request ``input_processor`` made (nothing is checked again).

        Args:
            req: the core's request.
            prompt_text: the prompt's text, reported in its outputs (None for
                token ids).
        Raises:
            InvalidRequestError: a duplicate request id, or structured outputs
                whose schema, regex or grammar is invalid (compiled in the
                core). Nothing is queued then.
            ValueError: invalid stop strings, or beams that cannot fit together.
        """
        out = self.output_processor
        # The output state first: invalid stop strings refuse the request here.
        if isinstance(req, AddBeamSearchRequest):
            out.add_beam_search(
                req.request_id, req.request_id, prompt_text, req.prompt_token_ids, req.arrival_time
            )
        else:
            out.add(
                req.request_id,
                req.request_id,
                prompt_text,
                req.prompt_token_ids,
                req.params,
                req.arrival_time,
            )
        try:
            if isinstance(req, AddBeamSearchRequest):
                self.core_client.add_beam_search_request(req)
            else:
                self.core_client.add_request(req)
        except BaseException:
            out.states.pop(req.request_id, None)
            raise

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Abort a request (every sequence); its blocks return to the free pool
        at once. Returns its output with finish_reason "abort" (a beam search:
        its hypotheses finished so far), or None if unknown.
        """
        deltas = self.core_client.abort_requests([request_id])
        if deltas:
            outputs = self.output_processor.apply(deltas).outputs
            return outputs[0][1] if outputs else None
        return self.output_processor.finish(request_id)

    def has_unfinished_requests(self) -> bool:
        """True while any request is waiting or running."""
        return self.core_client.has_unfinished_requests()

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
        result = self.output_processor.apply(self.core_client.step())
        for request_id, index, stop in result.stops:
            self.core_client.stop_sequence(request_id, index, stop)
        return [out for _, out in result.outputs]

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix (vLLM's name; publishes AllBlocksCleared).
        Returns False, changing nothing, while any request holds blocks."""
        return bool(self.core_client.call("reset_prefix_cache").result())

    def kv_cache_stats(self) -> dict[str, Any]:
        """Block pool and scheduler counters (keys: ``core.stats.engine_stats``)."""
        stats: dict[str, Any] = self.core_client.call("kv_cache_stats").result()
        return stats

    def shutdown(self) -> None:
        """Stop the executor's workers, the grammar thread and the KV event
        publisher, if any (idempotent)."""
        self.core_client.close()
