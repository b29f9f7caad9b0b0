"""Multi-LoRA serving: many adapters over one base model, batched in one step
(docs/lora.md).

``request`` (``LoRARequest``), ``config`` (the ``EngineArgs`` checks),
``peft`` (PEFT adapter folders read and checked), ``gguf_lora`` (llama.cpp's
GGUF LoRA files read and checked), ``loader`` (either, by path),
``adapter`` (``LoRAAdapter``: one adapter's float32 matrices), ``registry``
(``LoRARegistry``: loaded adapters up to ``max_cpu_loras``, the idle ones
evicted oldest first), ``layers`` (the projection wrappers that add an
adapter's product beside the base one),
``kernel`` (the Rust gathered shrink/expand, and its torch reference),
``manager`` (``LoRAModelManager``: the wrappers of a model, the
``max_loras`` slots, each step's token slots).
"""

from .request import LoRARequest

__all__ = ["LoRARequest"]
