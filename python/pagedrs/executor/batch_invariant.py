"""``batch_invariant=True`` for models run on HF's modules: every
``nn.Linear`` (the LM head included) replaced by a ``BatchInvariantLinear``,
whose forward is ``models.linear.Linear`` with ``batch_invariant=True``
(float32 CPU weights: the Rust dense kernel; bfloat16: oneDNN on a packed
weight), as ``quant.modules`` puts quantized projections in place of HF's.

pagedrs' own model code builds its projections with the same flag
(``models.native_model(..., batch_invariant=True)``). Quantized projections
(``QuantizedLinearModule``) are batch-invariant already and stay. A model
with other float matmul weights (GPT-2's ``Conv1D``, fused expert tensors)
is refused, naming the module: those would still run torch's matmuls.
"""

from __future__ import annotations

import torch
from torch import nn

from .models.linear import Linear
from .quant.modules import QuantizedEmbedding, QuantizedLinearModule


class BatchInvariantLinear(nn.Module):
    """``y = x @ W^T (+ b)`` computed by a batch-invariant ``Linear``.

    Args:
        weight: ``[N, K]``, float32 on CPU (or bfloat16 where oneDNN packs
            it); kept as the module's parameter (the same tensor, not a
            copy: a tied LM head stays tied).
        bias: ``[N]`` or None.

    Raises:
        ValueError: a weight batch invariance cannot hold for
            (``models.linear.check_batch_invariant``).
    """

    def __init__(self, weight: nn.Parameter | torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.weight = _param(weight)
        self.bias = None if bias is None else _param(bias)
        plain_bias = None if bias is None else bias.detach()
        self.linear = Linear(weight.detach(), plain_bias, batch_invariant=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., N]`` of ``x`` ``[..., K]``, in ``x``'s dtype."""
        lead = x.shape[:-1]
        y = self.linear(x.reshape(-1, self.in_features))
        return y.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, batch_invariant=True"


def _param(t: torch.Tensor) -> nn.Parameter:
    """``t`` itself if it is a parameter, else a frozen parameter over it."""
    return t if isinstance(t, nn.Parameter) else nn.Parameter(t, requires_grad=False)


#: Modules whose 2-d weights are not matmuls, or are batch-invariant already.
_INVARIANT = (nn.Embedding, BatchInvariantLinear, QuantizedLinearModule, QuantizedEmbedding)


def make_batch_invariant(model: nn.Module) -> int:
    """Replace every ``nn.Linear`` of ``model`` by a ``BatchInvariantLinear``
    over the same weight and bias, in place.

    Returns:
        the number of projections replaced.
    Raises:
        ValueError: naming the module, a weight batch invariance cannot hold
            for, or a module with a weight of two or more dimensions that is
            neither a projection replaced here, an embedding, nor quantized.
    """
    count = 0
    for name, module in list(model.named_modules()):
        if not isinstance(module, nn.Linear):
            continue
        try:
            replacement = BatchInvariantLinear(module.weight, module.bias)
        except ValueError as e:
            raise ValueError(f"{e} ({name})") from e
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, replacement)
        count += 1
    for name, module in model.named_modules():
        if isinstance(module, _INVARIANT):
            continue
        for pname, p in module.named_parameters(recurse=False):
            if p.dim() >= 2:
                raise ValueError(
                    f"batch_invariant: {name}.{pname} ({type(module).__name__}, "
                    f"{tuple(p.shape)}) is not an nn.Linear projection; its matmul would not "
                    "be batch-invariant"
                )
    return count
