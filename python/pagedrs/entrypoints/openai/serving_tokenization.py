"""``POST /tokenize`` and ``POST /detokenize`` (vLLM's bodies): a prompt, or a
conversation through the chat template, to token ids; token ids to text."""

from __future__ import annotations

from typing import Any

from ...engine.protocol import EngineClient
from .chat_tools import template_message
from .errors import bad_request
from .protocol import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
    TokenizeResponse,
)
from .tokenization import ServerTokenizer


class OpenAIServingTokenization:
    """Handler of ``/tokenize`` and ``/detokenize``."""

    def __init__(
        self, engine: EngineClient, served_model_names: list[str], tokenizer: ServerTokenizer
    ) -> None:
        self.engine = engine
        self.names = served_model_names
        self.tokenizer = tokenizer

    def _check_model(self, model: str | None) -> None:
        if model is not None and model not in self.names:
            raise bad_request(f"the model {model!r} is not served here", "model")

    async def tokenize(self, req: TokenizeCompletionRequest | TokenizeChatRequest) -> Any:
        """Token ids (and, asked, their strings) of a prompt or a conversation.

        Raises:
            OpenAIError: 400 for an unknown model, unsupported content, a chat
                template error or a text too long for the context.
        """
        self._check_model(req.model)
        if isinstance(req, TokenizeChatRequest):
            if not self.tokenizer.chat_template:
                raise bad_request("this model has no chat template", "messages")
            messages = []
            for i, m in enumerate(req.messages):
                if isinstance(m.content, list):
                    if any(p.type != "text" or p.text is None for p in m.content):
                        raise bad_request(
                            f"messages[{i}]: only text content parts are supported", "messages"
                        )
                    content = "".join(p.text or "" for p in m.content)
                else:
                    content = m.content or ""
                messages.append(template_message(m, content))
            tools = None if not req.tools else [t.model_dump(exclude_none=True) for t in req.tools]
            _, ids = await self.tokenizer.render_chat(
                messages, req.add_generation_prompt, tools, req.chat_template_kwargs
            )
        else:
            ids = await self.tokenizer.encode(req.prompt, add_special_tokens=req.add_special_tokens)
        strs = await self.tokenizer.token_strs(ids) if req.return_token_strs else None
        return TokenizeResponse(
            count=len(ids), max_model_len=self.engine.max_model_len, tokens=ids, token_strs=strs
        )

    async def detokenize(self, req: DetokenizeRequest) -> DetokenizeResponse:
        """The text of token ids.

        Raises:
            OpenAIError: 400 for an unknown model or an id outside the vocabulary.
        """
        self._check_model(req.model)
        vocab = self.engine.vocab_size
        bad = next(((i, t) for i, t in enumerate(req.tokens) if not 0 <= t < vocab), None)
        if bad is not None:
            raise bad_request(
                f"tokens must be in [0, {vocab}), got {bad[1]} at position {bad[0]}", "tokens"
            )
        return DetokenizeResponse(prompt=await self.tokenizer.decode(req.tokens))
