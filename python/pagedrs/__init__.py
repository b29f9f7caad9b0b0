"""pagedrs: an LLM serving engine built on PagedAttention (Kwon et al., SOSP 2023).

Layers: ``engine`` (Python API) -> ``_core`` (Rust scheduler and KV cache
manager) -> ``executor`` (model, sampler) with the ``attention`` backend
(torch on CPU, Triton ``kernels`` on GPU).

The names below are imported on first use, so importing a light module (the
router's ``pagedrs.serve.routing``, ``pagedrs.kv_events``) loads neither torch
nor transformers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .engine.arg_utils import EngineArgs
    from .engine.llm import LLM
    from .engine.llm_engine import LLMEngine
    from .inputs import PromptType, TextPrompt, TokensPrompt
    from .lora.request import LoRARequest
    from .outputs import CompletionOutput, RequestOutput
    from .sampling_params import BeamSearchParams, SamplingParams, StructuredOutputsParams

# Public name -> the module defining it.
_LAZY = {
    "LLM": ".engine.llm",
    "BeamSearchParams": ".sampling_params",
    "CompletionOutput": ".outputs",
    "EngineArgs": ".engine.arg_utils",
    "LLMEngine": ".engine.llm_engine",
    "LoRARequest": ".lora.request",
    "PromptType": ".inputs",
    "RequestOutput": ".outputs",
    "SamplingParams": ".sampling_params",
    "StructuredOutputsParams": ".sampling_params",
    "TextPrompt": ".inputs",
    "TokensPrompt": ".inputs",
}

__all__ = [
    "LLM",
    "BeamSearchParams",
    "CompletionOutput",
    "EngineArgs",
    "LLMEngine",
    "LoRARequest",
    "PromptType",
    "RequestOutput",
    "SamplingParams",
    "StructuredOutputsParams",
    "TextPrompt",
    "TokensPrompt",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
