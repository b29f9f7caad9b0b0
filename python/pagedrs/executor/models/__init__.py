"""pagedrs' own model code for the families it runs natively (fused projections,
packed steps, paged attention called directly); other models run HF's modules.

``NATIVE_MODELS`` maps each HF model type to its class; ``supports_native``
says whether a loaded model runs natively (its type, and every setting the
class computes exactly), ``native_model`` builds it.
"""

from __future__ import annotations

from collections.abc import Sequence

from transformers import PreTrainedModel

from .decoder import PagedDecoderModel
from .gemma import PagedGemmaModel
from .llama import PagedLlamaModel
from .moe import PagedQwen2MoeModel, PagedQwen3MoeModel
from .phi3 import PagedPhi3Model
from .qwen3 import PagedQwen3Model

#: HF model type -> the native class that runs it.
NATIVE_MODELS: dict[str, type[PagedDecoderModel]] = {
    t: cls
    for cls in (
        PagedLlamaModel,
        PagedQwen3Model,
        PagedGemmaModel,
        PagedPhi3Model,
        PagedQwen3MoeModel,
        PagedQwen2MoeModel,
    )
    for t in cls.model_types
}


def supports_native(model: PreTrainedModel) -> bool:
    """Whether a native class computes the same function as this HF model."""
    cls = NATIVE_MODELS.get(model.config.model_type)
    return cls is not None and cls.supports(model)


def native_model(
    model: PreTrainedModel,
    max_positions: int,
    batch_invariant: bool = False,
    layer_groups: Sequence[int] | None = None,
    group_windows: Sequence[int | None] | None = None,
) -> PagedDecoderModel:
    """The native model of ``model`` (``PagedDecoderModel``'s arguments).

    Raises:
        ValueError: no native implementation for the model (its type or a
            setting), or as ``PagedDecoderModel``.
    """
    cls = NATIVE_MODELS.get(model.config.model_type)
    if cls is None or not cls.supports(model):
        raise ValueError(f"no native implementation for {model.config.model_type!r}")
    return cls(model, max_positions, batch_invariant, layer_groups, group_windows)


__all__ = [
    "NATIVE_MODELS",
    "PagedDecoderModel",
    "PagedGemmaModel",
    "PagedLlamaModel",
    "PagedPhi3Model",
    "PagedQwen2MoeModel",
    "PagedQwen3MoeModel",
    "PagedQwen3Model",
    "native_model",
    "supports_native",
]
