"""Reading an adapter from where a ``LoRARequest`` points: a ``.gguf`` file
(llama.cpp's GGUF LoRA, ``gguf_lora``) or a PEFT folder (``peft``)."""

from __future__ import annotations

import os

from .adapter import LoRAAdapter
from .gguf_lora import load_gguf_adapter
from .peft import load_peft_adapter

__all__ = ["load_adapter"]


def load_adapter(path: str, lora_int_id: int, lora_name: str, max_lora_rank: int) -> LoRAAdapter:
    """The adapter at ``path``: a file is read as a GGUF LoRA adapter, a
    folder as a PEFT one.

    Raises:
        LoRAError: as ``gguf_lora.load_gguf_adapter`` or
            ``peft.load_peft_adapter``, naming the file, key or tensor.
    """
    if os.path.isfile(path):
        return load_gguf_adapter(path, lora_int_id, lora_name, max_lora_rank)
    return load_peft_adapter(path, lora_int_id, lora_name, max_lora_rank)
