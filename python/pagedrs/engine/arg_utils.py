"""Engine arguments, named as vLLM's ``EngineArgs``."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._core import ALLOCATION_POLICIES
from ..executor.model_registry import DEFAULT_MODEL

#: ``attention_backend`` values ("auto" resolves to one of the others).
ATTENTION_BACKENDS = ("auto", "cpu", "torch", "triton")

_DTYPES = {
    "float32": torch.float32,
    "float": torch.float32,
    "float16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
}


@dataclass
class EngineArgs:
    """Configuration of an engine.

    Attributes:
        model: packaged alias, HF folder, or .gguf path.
        tokenizer: tokenizer name if different from the model.
        dtype: "auto" (float32 on CPU, bfloat16 on GPU), "float32", "float16", "bfloat16".
        device: "auto", "cpu" or "cuda".
        block_size: tokens per KV block (paper default 16).
        kv_cache_memory_bytes: KV budget in bytes (default 4 GiB, as vLLM's CPU backend).
        num_gpu_blocks_override: exact number of device blocks (wins over the budget).
        max_model_len: longest sequence in tokens (default: the model's).
        max_num_seqs: most sequences per step.
        max_num_batched_tokens: token budget per step.
        enable_chunked_prefill: split long prompts across steps.
        enable_prefix_caching: reuse KV blocks of equal prefixes (SHA-256 block hashes).
        swap_space: CPU swap pool in GiB, for preemption_mode="swap".
        preemption_mode: "recompute" (default) or "swap".
        seed: seed of the sampler for requests without their own seed.
        attention_backend: "auto" (Triton on GPU; on CPU the Rust kernels for
            float32, else the torch path), "cpu" (the Rust kernels: float32 on
            CPU), "torch" (the plain torch reference, which gathers each
            context into a padded copy) or "triton" (on CPU: the interpreter).
        model_impl: "auto" (pagedrs' own fused code for Llama-family models, HF's
            modules otherwise), "pagedrs" (error if unsupported) or "transformers".
        allocation_policy: "paged" (PagedAttention: blocks on demand, the default),
            or a baseline of the paper's comparison (§6), for benchmarks:
            "reserve-max" (Orca Max: a contiguous chunk of max_model_len per
            request), "reserve-pow2" (prompt + next power of two of max_tokens),
            "reserve-oracle" (prompt + max_tokens exactly), "static" (as
            reserve-max, a new batch only when the last one is done). The
            reserving policies want block_size=1 and support n == 1 only.
        max_logprobs: most top logprobs a request may ask for (vLLM's default 20).
        tensor_parallel_size: ranks the model and every KV block are split over
            (one scheduler; workers started with torch.multiprocessing).
    """

    model: str = DEFAULT_MODEL
    tokenizer: str | None = None
    dtype: str = "auto"
    device: str = "auto"
    block_size: int = 16
    kv_cache_memory_bytes: int | None = None
    num_gpu_blocks_override: int | None = None
    max_model_len: int | None = None
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    swap_space: float = 4.0
    preemption_mode: str = "recompute"
    seed: int = 0
    attention_backend: str = "auto"
    tensor_parallel_size: int = 1
    max_logprobs: int = 20
    model_impl: str = "auto"
    allocation_policy: str = "paged"

    def __post_init__(self) -> None:
        for name in (
            "block_size",
            "max_num_seqs",
            "max_model_len",
            "max_num_batched_tokens",
            "num_gpu_blocks_override",
            "kv_cache_memory_bytes",
            "tensor_parallel_size",
            "max_logprobs",
        ):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool)):
                raise ValueError(f"{name} must be an integer, got {v!r}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if self.dtype != "auto" and self.dtype not in _DTYPES:
            raise ValueError(
                f"dtype must be 'auto' or one of {sorted(_DTYPES)}, got {self.dtype!r}"
            )
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {self.device!r}")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(
                f"attention_backend must be one of {ATTENTION_BACKENDS}, "
                f"got {self.attention_backend!r}"
            )
        if self.model_impl not in ("auto", "pagedrs", "transformers"):
            raise ValueError(
                f"model_impl must be 'auto', 'pagedrs' or 'transformers', got {self.model_impl!r}"
            )
        if self.allocation_policy not in ALLOCATION_POLICIES:
            raise ValueError(
                f"allocation_policy must be one of {tuple(ALLOCATION_POLICIES)}, "
                f"got {self.allocation_policy!r}"
            )
        if self.model_impl == "pagedrs" and self.tensor_parallel_size > 1:
            raise ValueError(
                "model_impl='pagedrs' runs whole layers on one rank; use 'auto' or "
                "'transformers' with tensor_parallel_size > 1"
            )
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {self.seed!r}")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("device='cuda' but torch sees no CUDA GPU; use 'auto' or 'cpu'")
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise ValueError("max_num_batched_tokens must be >= 1")
        if self.num_gpu_blocks_override is not None and self.num_gpu_blocks_override < 1:
            raise ValueError("num_gpu_blocks_override must be >= 1")
        if self.kv_cache_memory_bytes is not None and self.kv_cache_memory_bytes < 1:
            raise ValueError("kv_cache_memory_bytes must be >= 1")
        if self.preemption_mode not in ("recompute", "swap"):
            raise ValueError(
                f"preemption_mode must be 'recompute' or 'swap', got {self.preemption_mode!r}"
            )
        if not self.swap_space >= 0:
            raise ValueError(f"swap_space must be >= 0 GiB, got {self.swap_space}")

    def torch_device(self) -> torch.device:
        """The device to run on."""
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def resolved_attention_backend(self) -> str:
        """The attention backend every rank runs: ``attention_backend``, or for
        "auto" "triton" on GPU, "cpu" (Rust kernels) for float32 on CPU, else
        "torch"."""
        if self.attention_backend != "auto":
            return self.attention_backend
        if self.torch_device().type == "cuda":
            return "triton"
        return "cpu" if self.torch_dtype() == torch.float32 else "torch"

    def torch_dtype(self) -> torch.dtype:
        """The model and KV cache dtype."""
        if self.dtype == "auto":
            return torch.bfloat16 if self.torch_device().type == "cuda" else torch.float32
        return _DTYPES[self.dtype]
