"""``AttentionOptions``: how one layer attends, as one typed object every
attention backend takes.

The options some models add on top of causal softmax attention follow HF
transformers' eager semantics (see ``attention.torch_ops``): ``scale``
multiplies the logits (e.g. Gemma's ``query_pre_attn_scalar ** -0.5``);
``sliding_window`` (tokens; the query at position ``p`` sees keys
``p - sliding_window < k <= p``); ``softcap`` (logits become
``tanh(logits / softcap) * softcap`` after scaling); ``sinks`` (float32
``[Hq]``, a per query head logit that joins each softmax and whose weight is
dropped, gpt-oss). None turns each off. The KV cache dtype travels with the
caches (``kv_cache_dtype.format_of``), so it is not an option here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["AttentionOptions"]


@dataclass(frozen=True)
class AttentionOptions:
    """A layer's attention settings, normalized on construction: ``scale``
    and ``softcap`` as ``float``, ``sliding_window`` as ``int``, ``sinks`` as a
    detached float32 ``[Hq]`` tensor.

    Raises:
        ValueError: ``sliding_window`` < 1, ``softcap`` <= 0, or ``scale``
            not finite and positive.
    """

    scale: float
    sliding_window: int | None = None
    softcap: float | None = None
    sinks: torch.Tensor | None = None

    def __post_init__(self) -> None:
        scale = float(self.scale)
        if not 0 < scale < float("inf"):
            raise ValueError(f"scale must be a finite number > 0, got {self.scale}")
        object.__setattr__(self, "scale", scale)
        if self.sliding_window is not None:
            window = int(self.sliding_window)
            if window < 1:
                raise ValueError(f"sliding_window must be >= 1, got {window}")
            object.__setattr__(self, "sliding_window", window)
        if self.softcap is not None:
            softcap = float(self.softcap)
            if not softcap > 0:
                raise ValueError(f"softcap must be > 0, got {softcap}")
            object.__setattr__(self, "softcap", softcap)
        if self.sinks is not None:
            object.__setattr__(self, "sinks", self.sinks.detach().flatten().to(torch.float32))

    def check_heads(self, num_heads: int) -> None:
        """Raises:
        ValueError: ``sinks`` not of ``num_heads`` (query heads) elements."""
        if self.sinks is not None and self.sinks.numel() != num_heads:
            raise ValueError(
                f"sinks must hold one logit per query head ({num_heads}), "
                f"got {self.sinks.numel()} values"
            )

    def features(self) -> dict[str, Any]:
        """``sliding_window``, ``softcap`` and ``sinks`` as the keyword
        arguments of the reference ops (``torch_ops``) and the kernels."""
        return {"sliding_window": self.sliding_window, "softcap": self.softcap, "sinks": self.sinks}
