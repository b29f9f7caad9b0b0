"""Offline batched generation: ``LLM(...).generate(...)``, as in vLLM."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from tqdm.auto import tqdm

from ..inputs import PromptType
from ..lora.request import LoRARequest, per_prompt_loras
from ..outputs import RequestOutput
from ..sampling_params import BeamSearchParams, SamplingParams
from .arg_utils import EngineArgs
from .input_processor import ProcessedPrompt
from .llm_engine import LLMEngine


class LLM:
    """Offline LLM inference on a paged KV cache.

    Args:
        model: packaged alias (default ``smollm2-135m-instruct``), HF folder or .gguf.
        **kwargs: any ``EngineArgs`` field (block_size, kv_cache_memory_bytes,
            num_gpu_blocks_override, max_model_len, max_num_seqs, ...).

    Raises:
        ValueError: invalid argument or unknown model.
    """

    def __init__(self, model: str | None = None, **kwargs: Any) -> None:
        if model is not None:
            kwargs["model"] = model
        self.llm_engine = LLMEngine(EngineArgs(**kwargs))
        self._counter = itertools.count()

    def get_tokenizer(self) -> Any:
        """The HF tokenizer."""
        return self.llm_engine.tokenizer

    def generate(
        self,
        prompts: PromptType | ProcessedPrompt | Sequence[PromptType | ProcessedPrompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        priority: Sequence[int] | None = None,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt, batched by the engine; outputs in input order.

        Args:
            prompts: one prompt or a list (text, token ids, or prompt dicts).
            sampling_params: one for all prompts or one per prompt (default:
                ``SamplingParams()``).
            use_tqdm: show a progress bar.
            priority: one priority per prompt (lower runs first), with
                ``scheduling_policy="priority"``.
            lora_request: the LoRA adapter of every prompt, or one per prompt
                (None: the base model), with ``enable_lora`` (vLLM's).
        Raises:
            ValueError: empty prompt list, an empty or over-long prompt, a
                params, priority or lora_request list of the wrong length, a
                LoRA adapter that cannot be loaded or does not fit, priorities
                without priority scheduling, or structured outputs with an
                invalid schema, regex or grammar. Nothing is queued then.
        """
        items = self._prepare(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        if not isinstance(sampling_params, (SamplingParams, list, tuple)):
            raise TypeError(
                "sampling_params must be a SamplingParams or a list of them, "
                f"got {type(sampling_params).__name__}"
            )
        params = (
            [sampling_params] * len(items)
            if isinstance(sampling_params, SamplingParams)
            else list(sampling_params)
        )
        if len(params) != len(items):
            raise ValueError(f"got {len(params)} sampling params for {len(items)} prompts")
        if priority is not None and not isinstance(priority, (list, tuple)):
            raise ValueError(
                f"priority must be a list of integers, one per prompt, got {priority!r}"
            )
        priorities = [0] * len(items) if priority is None else list(priority)
        if len(priorities) != len(items):
            raise ValueError(f"got {len(priorities)} priorities for {len(items)} prompts")
        for sp in params:
            if not isinstance(sp, SamplingParams):
                raise TypeError(f"params must be SamplingParams, got {type(sp).__name__}")
        loras = per_prompt_loras(lora_request, len(items))  # LoRA (pagedrs.lora)
        return self._run(items, params, priorities, use_tqdm, loras)

    def _prepare(
        self, prompts: PromptType | ProcessedPrompt | Sequence[PromptType | ProcessedPrompt]
    ) -> list[ProcessedPrompt]:
        """Parse, tokenize and validate every prompt before any is queued.

        Raises:
            ValueError: empty prompt list, or an empty / over-long prompt.
        """
        if isinstance(prompts, (str, dict, ProcessedPrompt)) or (
            isinstance(prompts, list) and prompts and isinstance(prompts[0], int)
        ):
            prompts = [prompts]
        if not isinstance(prompts, (list, tuple)):
            raise TypeError(f"prompts must be a prompt or a list of them, got {type(prompts)}")
        items = []
        processor = self.llm_engine.input_processor
        for i, p in enumerate(prompts):
            try:
                items.append(processor.prompt(p))
            except ValueError as e:
                if len(prompts) == 1:
                    raise
                raise ValueError(f"prompt {i}: {e}") from e
        if not items:
            raise ValueError("prompts is empty: pass at least one prompt")
        return items

    def _run(
        self,
        items: list[ProcessedPrompt],
        params: Sequence[SamplingParams | BeamSearchParams],
        priorities: Sequence[int],
        use_tqdm: bool,
        loras: Sequence[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Make every request (each checked once, all before any is queued),
        queue them, step until all finish; outputs in input order. On any error
        every queued request is aborted."""
        engine = self.llm_engine
        ids = [f"{next(self._counter)}" for _ in items]
        reqs = [
            engine.input_processor.request(
                rid,
                item,
                params[i],
                priority=priorities[i],
                lora_request=None if loras is None else loras[i],
            )
            for i, (rid, item) in enumerate(zip(ids, items, strict=True))
        ]
        done: dict[str, RequestOutput] = {}
        try:
            for req, item in zip(reqs, items, strict=True):
                engine.enqueue(req, item.text)
            with tqdm(total=len(ids), desc="Processed prompts", disable=not use_tqdm) as bar:
                while engine.has_unfinished_requests():
                    for out in engine.step():
                        if out.finished:
                            done[out.request_id] = out
                            bar.update(1)
        except BaseException:
            for rid in ids:
                engine.abort_request(rid)
            raise
        return [done[r] for r in ids]

    def beam_search(
        self,
        prompts: PromptType | Sequence[PromptType],
        params: BeamSearchParams,
        use_tqdm: bool = True,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Beam search for every prompt inside the engine, batched with each
        other; beams share KV blocks (fork / copy-on-write).

        Args:
            lora_request: the LoRA adapter of every prompt, or one per prompt
                (None: the base model), with ``enable_lora`` (vLLM's); every
                beam of a prompt runs its adapter.
        Returns:
            per prompt, ``outputs`` holds the finished beams, best first
            (score = sum of logprobs / generated length ** length_penalty);
            ``cumulative_logprob`` is the plain sum.
        Raises:
            ValueError: empty prompt list, an invalid prompt, a lora_request
                list of the wrong length, or an adapter that cannot run;
                nothing is queued.
            TypeError: ``params`` is not ``BeamSearchParams`` (beam search does
                not support structured outputs).
        """
        if not isinstance(params, BeamSearchParams):
            so = getattr(params, "structured_outputs", None)
            why = "beam search does not support structured outputs; " if so else ""
            raise TypeError(f"{why}params must be BeamSearchParams, got {type(params).__name__}")
        items = self._prepare(prompts)
        loras = per_prompt_loras(lora_request, len(items))  # LoRA (pagedrs.lora)
        return self._run(items, [params] * len(items), [0] * len(items), use_tqdm, loras)

    def chat(
        self,
        messages: list[dict[str, Any]] | list[list[dict[str, Any]]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        *,
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        chat_template_kwargs: dict[str, Any] | None = None,
        tools: list[dict[str, Any]] | None = None,
        priority: Sequence[int] | None = None,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Generate replies to conversations rendered by a chat template (vLLM's
        ``LLM.chat``; the options after ``use_tqdm`` are keyword-only).

        Args:
            messages: one conversation (a list of ``{"role", "content"}``) or a
                list of them. ``content`` may be None in a message with
                ``tool_calls``.
            sampling_params: one for all conversations or one per conversation.
            chat_template: a Jinja template string used instead of the tokenizer's.
            add_generation_prompt: append the assistant turn's opening.
            continue_final_message: leave the last message open so the model
                continues it (e.g. a partial assistant reply).
            chat_template_kwargs: extra template variables; as in vLLM they
                override the options above on a clash.
            tools: tool (function) definitions, passed to the template as ``tools``.
            priority: one per conversation, as ``generate``'s.
            lora_request: one LoRA adapter for all, or one per conversation,
                as ``generate``'s.
        Raises:
            ValueError: empty conversation list, a malformed message, both
                add_generation_prompt and continue_final_message, or no chat
                template (neither the tokenizer's nor ``chat_template``).
        """
        convs = [messages] if messages and isinstance(messages[0], dict) else messages
        if not convs:
            raise ValueError("messages is empty")
        if tools is not None and not (
            isinstance(tools, list) and all(isinstance(t, dict) for t in tools)
        ):
            raise ValueError("tools must be a list of tool dicts")
        kwargs: dict[str, Any] = {
            "chat_template": chat_template,
            "add_generation_prompt": add_generation_prompt,
            "continue_final_message": continue_final_message,
            "tools": tools,
        }
        kwargs.update(chat_template_kwargs or {})
        processor = self.llm_engine.input_processor
        for c in convs:  # every conversation is well formed before any is rendered
            processor.check_conversation(c)  # type: ignore[arg-type]
        prompts = [processor.chat_prompt(c, **kwargs) for c in convs]  # type: ignore[arg-type]
        return self.generate(
            prompts,
            sampling_params,
            use_tqdm=use_tqdm,
            priority=priority,
            lora_request=lora_request,
        )

    def shutdown(self) -> None:
        """Stop the engine's tensor-parallel workers, if any (idempotent)."""
        self.llm_engine.shutdown()

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix (publishing AllBlocksCleared when KV events
        are on). Returns False, changing nothing, while a request holds blocks."""
        return self.llm_engine.reset_prefix_cache()

    def kv_cache_stats(self) -> dict[str, Any]:
        """Pool counters: num_total_blocks, num_free_blocks, num_preemptions, ..."""
        return self.llm_engine.kv_cache_stats()
