"""``LoRAAdapter``: one adapter's low-rank matrices, as the engine holds them."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["SUPPORTED_MODULES", "LoRAAdapter", "LoRAError", "LoRAWeights"]

#: The decoder projections an adapter may target (the attention's q/k/v/o and
#: the gated MLP's gate/up/down, the names of Llama, Qwen2 and Gemma 3).
SUPPORTED_MODULES: tuple[str, ...] = (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
)


class LoRAError(ValueError):
    """An adapter that cannot be loaded or does not fit the model; the message
    names the file, field or tensor at fault.

    Attributes:
        param: the request field the server reports (``"model"`` for the
            adapter a request names, ``"lora_path"`` for a load).
    """

    def __init__(self, message: str, param: str = "model") -> None:
        super().__init__(message)
        self.param = param


@dataclass
class LoRAWeights:
    """The matrices of one adapted projection.

    Attributes:
        lora_a: float32 ``[rank, in_features]`` (PEFT's ``lora_A.weight``).
        lora_b: float32 ``[out_features, rank]`` (PEFT's ``lora_B.weight``).
    """

    lora_a: torch.Tensor
    lora_b: torch.Tensor

    @property
    def rank(self) -> int:
        """Rows of ``lora_a``."""
        return int(self.lora_a.shape[0])


@dataclass
class LoRAAdapter:
    """An adapter loaded in host memory.

    Attributes:
        lora_int_id: its id (``LoRARequest.lora_int_id``).
        lora_name: its name.
        lora_path: where it was read from.
        rank: its ``r``.
        scaling: ``lora_alpha / r``, or ``lora_alpha / sqrt(r)`` with rsLoRA.
        weights: per (decoder layer, projection name in ``SUPPORTED_MODULES``)
            its matrices; projections it does not adapt are absent.
        gguf_arch: a GGUF LoRA file's ``general.architecture``
            (``gguf_lora``), None for a PEFT folder.
    """

    lora_int_id: int
    lora_name: str
    lora_path: str
    rank: int
    scaling: float
    weights: dict[tuple[int, str], LoRAWeights] = field(default_factory=dict)
    gguf_arch: str | None = None

    @property
    def nbytes(self) -> int:
        """Bytes its matrices hold."""
        return sum(
            w.lora_a.numel() * w.lora_a.element_size() + w.lora_b.numel() * w.lora_b.element_size()
            for w in self.weights.values()
        )

    @property
    def target_modules(self) -> list[str]:
        """The projection names it adapts, in ``SUPPORTED_MODULES`` order."""
        names = {m for _, m in self.weights}
        return [m for m in SUPPORTED_MODULES if m in names]
