"""The memory LoRA adapters may take, set aside from the KV cache budget
before the pool is sized, so that enabling LoRA never commits more than the
budget (``kv_cache_memory_bytes``, or the CPU default).

What is held, float32: up to ``max_cpu_loras`` loaded adapters
(``LoRARegistry``), each at most ``max_lora_rank`` on every projection of
``adapter.SUPPORTED_MODULES`` of every decoder layer, and the ``max_loras``
slots (``SlotStack``), each padded to ``max_lora_rank``. One adapted
projection of shape ``[out, in]`` holds ``r * (in + out)`` floats, so the
bound is

    4 bytes * max_lora_rank * (max_cpu_loras + max_loras) * sum(in + out)

over the model's decoder projections (a GGUF or int8 base model's too: the
adapters are float32 whatever the weights).
"""

from __future__ import annotations

from typing import Any

from .adapter import SUPPORTED_MODULES

__all__ = ["floats_per_rank", "lora_reserved_bytes"]

_PARENTS = {
    "self_attn": ("q_proj", "k_proj", "v_proj", "o_proj"),
    "mlp": ("gate_proj", "up_proj", "down_proj"),
}
assert {m for ms in _PARENTS.values() for m in ms} == set(SUPPORTED_MODULES)


def floats_per_rank(model: Any) -> int:
    """``sum(in + out)`` over the decoder projections an adapter may target
    (``layers.<i>.self_attn.{q,k,v,o}_proj``, ``layers.<i>.mlp.{gate,up,down}_proj``
    of ``model.get_decoder()``): the float32 values one adapter holds per
    unit of rank when it adapts all of them. Projections a layer lacks count
    0 (``LoRAModelManager`` refuses such a model)."""
    total = 0
    for layer in model.get_decoder().layers:
        for parent_name, names in _PARENTS.items():
            parent = getattr(layer, parent_name, None)
            for name in names:
                module = getattr(parent, name, None)
                if module is not None and hasattr(module, "in_features"):
                    total += int(module.in_features) + int(module.out_features)
    return total


def lora_reserved_bytes(model: Any, max_loras: int, max_lora_rank: int, max_cpu_loras: int) -> int:
    """Bytes set aside for adapters: the module docs' bound, the most the
    loaded adapters and the slots can hold together."""
    return 4 * max_lora_rank * (max_cpu_loras + max_loras) * floats_per_rank(model)
