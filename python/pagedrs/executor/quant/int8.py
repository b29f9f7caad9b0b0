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

import torch
from torch import nn

from .modules import QuantizedLinearModule
from .weight import QuantizedWeight


def quantize_int8(weight: torch.Tensor) -> QuantizedWeight:
    """The int8 ``QuantizedWeight`` of a float ``[N, K]`` weight (module docs).

    Raises:
        ValueError: a weight that is not 2-D or not finite.
    """
    if weight.dim() != 2:
        raise ValueError(f"int8 quantization needs a [N, K] weight, got {list(weight.shape)}")
    w = weight.detach().to(torch.float32)
    if not bool(torch.isfinite(w).all()):
        raise ValueError("int8 quantization of a weight with inf or nan values")
    absmax = w.abs().amax(dim=1)
    scales = torch.where(absmax > 0, absmax / 127.0, torch.ones_like(absmax))
    q = torch.round(w / scales[:, None]).clamp_(-127, 127).to(torch.int8)
    return QuantizedWeight("int8", (w.shape[0], w.shape[1]), q.contiguous(), scales.contiguous())


def quantize_model_int8(model: nn.Module) -> int:
    """Replace every ``nn.Linear`` of ``model``'s decoder layers by its int8
    ``QuantizedLinearModule``, in place, one layer at a time.

    Returns:
        the number of projections quantized.
    Raises:
        ValueError: a model with no decoder layers (``get_decoder().layers``).
    """
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
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
