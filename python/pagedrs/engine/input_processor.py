"""``InputProcessor``: the one way a prompt becomes a request the engine core
trusts (vLLM v1's ``InputProcessor``).

Every front end holds one: ``LLM`` / ``LLMEngine`` offline, ``AsyncLLM`` (the
OpenAI-compatible server's engine and each Ray Serve replica's). It parses a
prompt (text, token ids, or a prompt dict), renders conversations with the chat
template, tokenizes, validates (``validation``: once per front-end call), and
makes the core's ``AddRequest`` / ``AddBeamSearchRequest``. The core checks
nothing of it again but the Rust scheduler's invariants.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ..inputs import PromptType, parse_prompt
from ..lora.request import LoRARequest
from ..sampling_params import BeamSearchParams, SamplingParams
from .core.errors import InvalidRequestError
from .core.messages import AddBeamSearchRequest, AddRequest
from .validation import check_params, check_priority, check_prompt

__all__ = ["InputProcessor", "ProcessedPrompt"]


@dataclass(frozen=True)
class ProcessedPrompt:
    """A parsed, tokenized and validated prompt.

    Attributes:
        text: the prompt's text, when it came as text (None for token ids).
        token_ids: its token ids.
        cache_salt: the prompt dict's ``cache_salt``, if any.
    """

    text: str | None
    token_ids: list[int]
    cache_salt: str | None = None


class InputProcessor:
    """Parse, template, tokenize and validate prompts; make core requests.

    Args:
        tokenizer: the HF tokenizer of the front end.
        max_model_len: the context length, in tokens.
        vocab_size: the model's vocabulary size (token ids are in ``[0, vocab_size)``).
        max_logprobs: the most ``logprobs`` / ``prompt_logprobs`` a request may
            ask for (negative: no limit).
        scheduling_policy: ``"fcfs"`` or ``"priority"`` (priorities allowed).
    """

    def __init__(
        self,
        tokenizer: Any,
        max_model_len: int,
        vocab_size: int,
        max_logprobs: int,
        scheduling_policy: str,
    ) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.max_logprobs = max_logprobs
        self.scheduling_policy = scheduling_policy

    def tokenize(self, text: str) -> list[int]:
        """Token ids of ``text`` with the tokenizer's special tokens."""
        return list(self.tokenizer(text).input_ids)

    def prompt(self, prompt: PromptType | ProcessedPrompt) -> ProcessedPrompt:
        """Parse, tokenize and validate one prompt (a ``ProcessedPrompt`` is
        returned as it is: it was validated when made).

        Raises:
            InvalidRequestError: (param ``prompt``) not a prompt, empty, over
                ``max_model_len - 1`` tokens, or with ids outside the vocabulary.
        """
        if isinstance(prompt, ProcessedPrompt):
            return prompt
        try:
            text, ids, salt = parse_prompt(prompt)
        except (TypeError, ValueError) as exc:
            raise InvalidRequestError(str(exc), param="prompt") from None
        if ids is None:
            ids = self.tokenize(text or "")
        check_prompt(ids, self.max_model_len, self.vocab_size)
        return ProcessedPrompt(text, ids, salt)

    @staticmethod
    def check_conversation(conversation: list[dict[str, Any]]) -> None:
        """Raises:
        ValueError: not a non-empty list of messages, each a dict with a str
            ``role`` and a str ``content`` (None with ``tool_calls``)."""
        if not isinstance(conversation, list) or not conversation:
            raise ValueError("each conversation must be a non-empty list of messages")
        for m in conversation:
            if not (
                isinstance(m, dict)
                and isinstance(m.get("role"), str)
                and (
                    isinstance(m.get("content"), str)
                    or (m.get("content") is None and m.get("tool_calls"))
                )
            ):
                raise ValueError(
                    f"each message must be a dict with str 'role' and 'content', got {m!r}"
                )

    def render_chat(self, conversation: list[dict[str, Any]], **template_kwargs: Any) -> str:
        """The text of a conversation under the chat template (HF's
        ``apply_chat_template``; ``template_kwargs``: ``chat_template``,
        ``add_generation_prompt``, ``continue_final_message``, ``tools``, and
        any template variable).

        Raises:
            ValueError: a malformed message, both ``add_generation_prompt`` and
                ``continue_final_message``, or no chat template (neither the
                tokenizer's nor ``chat_template``).
        """
        self.check_conversation(conversation)
        kwargs = {"add_generation_prompt": True, **template_kwargs, "tokenize": False}
        if kwargs["add_generation_prompt"] and kwargs.get("continue_final_message"):
            raise ValueError("continue_final_message and add_generation_prompt cannot both be True")
        if not kwargs.get("chat_template") and not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(
                "this model's tokenizer has no chat template (a GGUF file's "
                "'tokenizer.chat_template' key, an HF tokenizer's 'chat_template'); "
                "pass chat_template"
            )
        return str(self.tokenizer.apply_chat_template(conversation, **kwargs))

    def chat_prompt(
        self, conversation: list[dict[str, Any]], **template_kwargs: Any
    ) -> ProcessedPrompt:
        """A conversation as a validated prompt: ``render_chat``, then its
        tokens without added special tokens (the template holds them).

        Raises:
            ValueError: as ``render_chat``.
            InvalidRequestError: as ``prompt``.
        """
        text = self.render_chat(conversation, **template_kwargs)
        ids = list(self.tokenizer(text, add_special_tokens=False).input_ids)
        check_prompt(ids, self.max_model_len, self.vocab_size)
        return ProcessedPrompt(text, ids)

    def check_request(self, params: SamplingParams | BeamSearchParams, priority: int = 0) -> None:
        """Check a request's parameters and priority.

        Raises:
            InvalidRequestError: a priority the scheduling policy refuses, or
                logprobs over ``max_logprobs``.
            TypeError: ``params`` is neither ``SamplingParams`` nor
                ``BeamSearchParams``.
        """
        check_priority(priority, self.scheduling_policy)
        if isinstance(params, BeamSearchParams):
            if priority != 0:
                raise InvalidRequestError(
                    "beam search requests run at priority 0", param="priority"
                )
            return
        check_params(params, self.max_logprobs)

    def request(
        self,
        request_id: str,
        prompt: ProcessedPrompt,
        params: SamplingParams | BeamSearchParams,
        *,
        arrival_time: float | None = None,
        cache_salt: str | None = None,
        priority: int = 0,
        lora_request: LoRARequest | None = None,
    ) -> AddRequest | AddBeamSearchRequest:
        """The core's request for a processed prompt (``check_request`` first).

        Args:
            request_id: the request's id in the core.
            arrival_time: seconds since the epoch (default now).
            cache_salt: overrides the prompt dict's.
            lora_request: the LoRA adapter to run with (``pagedrs.lora``; a
                beam search runs every beam with it).
        Raises:
            InvalidRequestError: as ``check_request``.
            TypeError: as ``check_request``.
        """
        self.check_request(params, priority)
        arrival = time.time() if arrival_time is None else arrival_time
        if isinstance(params, BeamSearchParams):
            return AddBeamSearchRequest(request_id, prompt.token_ids, params, arrival, lora_request)
        salt = cache_salt if cache_salt is not None else prompt.cache_salt
        return AddRequest(
            request_id, prompt.token_ids, params, arrival, salt, int(priority), lora_request
        )
