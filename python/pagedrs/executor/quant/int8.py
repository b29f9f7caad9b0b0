"""``quantization="int8"``: a float checkpoint's projections quantized on
load to int8, symmetric, one scale per output channel.

For a float weight ``w [N, K]``: ``scale[n] = max_k |w[n, k]| / 127`` (1 for
an all-zero row) and ``q[n, k] = round(w[n, k] / scale[n])`` in ``[-127,
127]``, so ``w ~ q * scale`` with an error of at most ``scale[n] / 2`` per
value (the per-channel weight-only scheme of LLM.int8's and vLLM's int8
weights). Every ``nn.Linear`` inside the decoder layers becomes a
``QuantizedLinearModule``, one at a time, its float weight released as soon
as its int8 copy exists; the embeddings and the LM head stay float (as vLLM
keeps ``lm_head`` unquantized), as do layers that are not ``nn.Linear``
(fused expert tensors, GPT-2's ``Conv1D``).
"""

from __future__ import annotations

from torch import nn

from .modules import QuantizedLinearModule
from .weight import quantize_int8

__all__ = ["quantize_int8", "quantize_model_int8"]


def quantize_model_int8(model: nn.Module) -> int:
    """Replace every ``nn.Linear`` of ``model``'s decoder layers by its int8
    ``QuantizedLinearModule``, in place, one layer at a time.

    Returns:
        the number of projections quantized.
    Raises:
        ValueError: a model with no decoder layers (``get_decoder().layers``).
    """
    get_decoder = getattr(model, "get_decoder", None)
    decoder = get_decoder() if callable(get_decoder) else None
    layers = getattr(decoder, "layers", None)
    if layers is None:
        raise ValueError(
            f"quantization='int8': {type(model).__name__} has no decoder layers to quantize"
        )
    count = 0
    for layer in layers:
        for name, module in list(layer.named_modules()):
            if type(module) is not nn.Linear:
                continue
            bias = None if module.bias is None else module.bias.detach()
            quantized = QuantizedLinearModule(quantize_int8(module.weight), bias)
            parent_name, _, child = name.rpartition(".")
            parent = layer.get_submodule(parent_name) if parent_name else layer
            setattr(parent, child, quantized)
            module.weight = None  # type: ignore[assignment]  # release the float copy now
            count += 1
    return count
