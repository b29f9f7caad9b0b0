"""pagedrs: an LLM serving engine built on PagedAttention (Kwon et al., SOSP 2023).

Layers: ``engine`` (Python API) -> ``_core`` (Rust scheduler and KV cache
manager) -> ``executor`` (model, sampler) with the ``attention`` backend
(torch on CPU, Triton ``kernels`` on GPU).
"""

from .engine.arg_utils import EngineArgs
from .engine.llm import LLM
from .engine.llm_engine import LLMEngine
from .inputs import PromptType, TextPrompt, TokensPrompt
from .outputs import CompletionOutput, RequestOutput
from .sampling_params import BeamSearchParams, SamplingParams, StructuredOutputsParams

__all__ = [
    "LLM",
    "BeamSearchParams",
    "CompletionOutput",
    "EngineArgs",
    "LLMEngine",
    "PromptType",
    "RequestOutput",
    "SamplingParams",
    "StructuredOutputsParams",
    "TextPrompt",
    "TokensPrompt",
]
