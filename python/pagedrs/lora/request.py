"""``LoRARequest``: the LoRA adapter a request runs with, named as vLLM's."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

__all__ = ["LoRARequest", "per_prompt_loras"]


class LoRARequest(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True):
    """A LoRA adapter for one request (vLLM's ``LoRARequest`` fields).

    Attributes:
        lora_name: the adapter's name (the server's ``model`` field).
        lora_int_id: the adapter's id, unique per adapter, >= 1 (0 is the
            base model): the engine keys its loaded adapters, the prefix
            cache's block hashes and ``max_loras`` admission by it.
        lora_path: a PEFT folder (``adapter_config.json`` and
            ``adapter_model.safetensors``) or a llama.cpp GGUF LoRA file.
        base_model_name: the base model it was trained on (informational).

    It is a ``msgspec`` struct, so it crosses to the engine-core process in
    the ``AddRequest`` message as is.
    """

    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    base_model_name: str | None = None

    @property
    def adapter_id(self) -> int:
        """``lora_int_id`` (vLLM's alias)."""
        return self.lora_int_id

    @property
    def name(self) -> str:
        """``lora_name`` (vLLM's alias)."""
        return self.lora_name

    @property
    def path(self) -> str:
        """``lora_path`` (vLLM's alias)."""
        return self.lora_path


def per_prompt_loras(
    lora_request: LoRARequest | Sequence[LoRARequest | None] | None, num_prompts: int
) -> list[LoRARequest | None]:
    """``LLM.generate``'s ``lora_request`` as one entry per prompt: one
    request for all, or a list of one per prompt (None: the base model).

    Raises:
        ValueError: a list of another length.
        TypeError: anything else than a ``LoRARequest``, None or such a list.
    """
    if lora_request is None or isinstance(lora_request, LoRARequest):
        return [lora_request] * num_prompts
    if not isinstance(lora_request, (list, tuple)):
        raise TypeError(
            "lora_request must be a LoRARequest or a list of them, "
            f"got {type(lora_request).__name__}"
        )
    loras = list(lora_request)
    if len(loras) != num_prompts:
        raise ValueError(f"got {len(loras)} lora_requests for {num_prompts} prompts")
    for r in loras:
        if r is not None and not isinstance(r, LoRARequest):
            raise TypeError(f"lora_request entries must be LoRARequest or None, got {r!r}")
    return loras
