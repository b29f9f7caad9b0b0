"""Engine arguments, named as vLLM's ``EngineArgs``."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from .._core import (
    ALLOCATION_POLICIES,
    PREEMPTION_MODES,
    SCHEDULING_POLICIES,
    check_scheduler_args,
)
from ..config_values import ACTIVATION_QUANTIZATION_CHOICES, KV_CACHE_DTYPES, LOAD_FORMATS
from ..executor.model_registry import DEFAULT_MODEL, PACKAGED_MODELS
from ..kv_events import KVEventsConfig
from ..lora.config import check_lora_args
from ..spec_decode.config import parse_speculative_config
from .cli_flags import add_dataclass_flags, field_docs

if TYPE_CHECKING:
    import torch

    from ..attention.kv_cache_dtype import KVCacheDtype

# The model's dtype of each ``dtype`` name (torch's attribute names).
_DTYPES = {
    "float32": "float32",
    "float": "float32",
    "float16": "float16",
    "half": "float16",
    "bfloat16": "bfloat16",
}

# The fixed value sets of EngineArgs fields: validation and the command line use these.
DTYPES: tuple[str, ...] = ("auto", *_DTYPES)
DEVICES: tuple[str, ...] = ("auto", "cpu", "cuda")
ATTENTION_BACKENDS: tuple[str, ...] = ("auto", "cpu", "torch", "triton")  # "auto" resolves
MODEL_IMPLS: tuple[str, ...] = ("auto", "pagedrs", "transformers")
ALLOCATION_POLICY_NAMES: tuple[str, ...] = tuple(ALLOCATION_POLICIES)
PREEMPTION_MODE_NAMES: tuple[str, ...] = tuple(PREEMPTION_MODES)
SCHEDULING_POLICY_NAMES: tuple[str, ...] = tuple(SCHEDULING_POLICIES)


@dataclass
class EngineArgs:
    """Configuration of an engine.

    Attributes:
        model: packaged alias, HF folder, .gguf path, or Hugging Face Hub id
            (org/name, fetched with huggingface_hub; HF_TOKEN and HF_HUB_OFFLINE
            are read from the environment).
        tokenizer: tokenizer name if different from the model.
        revision: Hub revision (branch, tag or commit) of a Hub model (default: main).
        download_dir: Hub cache folder for Hub models (default: $HF_HUB_CACHE or
            huggingface_hub's own).
        dtype: "auto" (float32 on CPU, bfloat16 on GPU), "float32", "float16", "bfloat16".
        device: "auto", "cpu" or "cuda".
        block_size: tokens per KV block (paper default 16).
        kv_cache_memory_bytes: KV budget in bytes; wins over gpu_memory_utilization
            (default: on CPU 4 GiB, as vLLM's CPU backend; on GPU what
            gpu_memory_utilization leaves).
        gpu_memory_utilization: share of the GPU's memory (0 to 1] this engine
            may use, as vLLM: after a profiling forward of max_num_batched_tokens
            tokens, the KV cache gets that share of the total memory less the
            weights, the forward's peak activations and what other processes
            hold. GPU only (ignored on CPU).
        num_gpu_blocks_override: exact number of device blocks (wins over the budget).
        max_model_len: longest sequence in tokens (default: the model's).
        max_num_seqs: most sequences per step.
        max_num_batched_tokens: token budget per step.
        enable_chunked_prefill: split long prompts across steps.
        enable_prefix_caching: reuse KV blocks of equal prefixes (SHA-256 block hashes).
        swap_space: CPU swap pool in GiB, for preemption_mode="swap".
        preemption_mode: "recompute" (default) or "swap".
        seed: seed of the sampler for requests without their own seed.
        kv_cache_dtype: how the paged KV cache stores keys and values (vLLM's
            names): "auto" (the model's dtype; bfloat16 for a float32 model
            on CPU with quantized projections: a GGUF file or
            quantization="int8"), "float32", "bfloat16",
            "fp8" / "fp8_e4m3" and "fp8_e5m2" (a saturating cast, unit scale),
            "int8" / "int8_per_token_head" (per token and KV head, a bfloat16
            scale stored in the block beside the values). Bytes per token
            per layer and KV head, keys and values, at head_dim 64: float32
            512, bfloat16 256, fp8 128, int8 132.
        attention_backend: "auto" (on GPU Triton, on CPU the Rust kernels,
            each where it runs the model dtype and kv_cache_dtype, else the
            torch path), "cpu" (the Rust kernels: float32 or bfloat16 models
            on CPU, KV caches of float32, bfloat16, fp8 or int8), "torch"
            (the plain torch reference, which gathers each context into a
            padded copy; every dtype) or "triton" (on CPU: the interpreter;
            every KV cache dtype, fp8_e4m3 on GPUs of compute capability 8.9
            or newer). A backend that cannot run the KV cache dtype is
            refused here, naming it.
        model_impl: "auto" (pagedrs' own fused code where the model has one,
            ``executor.models.supports_native``: Llama, Mistral, Qwen2/3,
            Gemma/Gemma 2/3, Phi-3, Qwen2-MoE/Qwen3-MoE; HF's modules
            otherwise), "pagedrs"
            (error if unsupported) or "transformers".
        allocation_policy: "paged" (PagedAttention: blocks on demand, the default),
            or a baseline of the paper's comparison (§6), for benchmarks:
            "reserve-max" (Orca Max: a contiguous chunk of max_model_len per
            request), "reserve-pow2" (prompt + next power of two of max_tokens),
            "reserve-oracle" (prompt + max_tokens exactly), "static" (as
            reserve-max, a new batch only when the last one is done). The
            reserving policies want block_size=1 and support n == 1 only.
        max_logprobs: most top logprobs a request may ask for (vLLM's default 20;
            -1: no limit).
        tensor_parallel_size: ranks the model and every KV block are split over
            (one scheduler; workers started with torch.multiprocessing).
        scheduling_policy: "fcfs" (first come, first served, the default) or
            "priority" (vLLM's semantics: requests with a lower ``priority``
            value run first, then by arrival; a waiting request preempts worse
            running ones when the KV cache or max_num_seqs is the limit).
        disable_hybrid_kv_cache_manager: one full-attention KV cache group of
            all layers: sliding-window layers keep every token's blocks (as
            full-attention ones) instead of only their window's (attention
            still applies the windows).
        load_format: "auto" (the weights of the model's files) or "dummy"
            (vLLM's name: random weights of the config's shapes, created on the
            device; for benchmarks; one rank only).
        quantization: None (vLLM's default: what the checkpoint holds; a
            .gguf file on CPU keeps its Q4_0..Q6_K tensors quantized) or
            "int8" (a float checkpoint's decoder projections quantized on
            load to int8 per output channel; CPU only).
        activation_quantization: how quantized projections quantize their
            activations, per block of 32 values with a float32 scale: "int16"
            (the exact option: rounding 1/32767 of a block's largest value),
            "int8" (llama.cpp's Q8_0 blocks, 1/127; AVX-512 VNNI runs it with
            ``vpdpbusd``, twice the products an instruction), or "auto" (the
            faster int8 where its measured quality against HF on the same
            weights is at least llama.cpp's: see docs/quantization.md). "int16"
            and "int8" are refused for a model without quantized projections.
        enforce_eager: run every step eagerly; otherwise, on a GPU, decode
            steps of up to max_num_seqs sequences replay CUDA graphs captured at
            start for a set of batch sizes (inputs padded to the next one). On
            CPU steps always run eagerly (no graphs), whatever this says.
        kv_events_config: KV cache events for prefix-aware routers, as a JSON
            object of vLLM's ``KVEventsConfig`` fields, e.g.
            '{"enable_kv_cache_events": true, "endpoint": "tcp://*:5557",
            "replay_endpoint": "tcp://*:5558", "topic": "kv-events"}':
            prefix-cache stores and evictions published per step as vLLM's
            KVEventBatch (msgpack) on a ZeroMQ PUB socket
            (``pagedrs.kv_events``). Needs enable_prefix_caching.
        data_parallel_rank: this engine's index among data-parallel replicas
            (``pagedrs.serve``), sent as the KV event batches'
            ``data_parallel_rank``; None: a single engine.
        speculative_config: speculative decoding (vLLM's ``speculative_config``),
            a dict, or its JSON object on the command line, e.g.
            '{"method": "ngram", "num_speculative_tokens": 5,
            "prompt_lookup_max": 4, "prompt_lookup_min": 2}': "ngram" (prompt
            lookup over the request's own tokens) or "suffix" (SuffixDecoding
            over the request and earlier outputs) propose up to
            num_speculative_tokens tokens a step, which the model verifies in
            one step; outputs are those without speculation (greedy and seeded
            sampling token for token on batch-invariant projections). Methods
            that need a second model (draft_model, eagle, ...) are refused.
            Requests with n > 1 or structured outputs run without it (see
            docs/speculative_decoding.md). None: off.
        batch_invariant: every float projection of the model, the LM head
            included, gives a row the same bits whatever the other rows of
            the step (vLLM's ``VLLM_BATCH_INVARIANT`` is the analogue): a
            request's greedy tokens and logprobs are then bit-identical
            alone or in any batch, and a speculative verify step of K+1
            tokens equals K+1 one-token steps. float32 weights run the Rust
            dense kernel (a fixed reduction order per output) instead of
            torch's ``F.linear``; bfloat16 ones are invariant where oneDNN
            packs them (AVX-512 BF16 or AVX-NE-CONVERT CPUs) and refused
            elsewhere, as are other dtypes, devices other than the CPU,
            tensor_parallel_size > 1 and attention backends other than
            "cpu" (the Rust kernels, invariant by construction).
        enable_lora: serve LoRA adapters (``LoRARequest`` per request, PEFT
            folders; docs/lora.md): requests of different adapters and of
            the base model share a step. CPU only, one rank.
        max_loras: most distinct adapters among the running requests (the
            adapter slots a step can use; the scheduler admits by it).
        max_lora_rank: the largest adapter rank ``r`` accepted (slots are
            padded to it).
        max_cpu_loras: most adapters loaded in host memory (idle ones are
            evicted least recently used first); None: max_loras.
    """

    model: str = DEFAULT_MODEL
    tokenizer: str | None = None
    revision: str | None = None
    download_dir: str | None = None
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
    kv_cache_dtype: str = "auto"
    attention_backend: str = "auto"
    tensor_parallel_size: int = 1
    max_logprobs: int = 20
    model_impl: str = "auto"
    allocation_policy: str = "paged"
    disable_hybrid_kv_cache_manager: bool = False
    scheduling_policy: str = "fcfs"
    kv_events_config: str | None = None
    data_parallel_rank: int | None = None
    gpu_memory_utilization: float = 0.9
    load_format: str = "auto"
    quantization: str | None = None
    activation_quantization: str = "auto"
    enforce_eager: bool = False
    speculative_config: str | dict[str, Any] | None = None
    batch_invariant: bool = False
    # LoRA (pagedrs.lora)
    enable_lora: bool = False
    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None

    #: Fields with a fixed set of values (``choices`` on the command line).
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {
        "dtype": DTYPES,
        "device": DEVICES,
        "preemption_mode": PREEMPTION_MODE_NAMES,
        "kv_cache_dtype": KV_CACHE_DTYPES,
        "attention_backend": ATTENTION_BACKENDS,
        "model_impl": MODEL_IMPLS,
        "allocation_policy": ALLOCATION_POLICY_NAMES,
        "scheduling_policy": SCHEDULING_POLICY_NAMES,
        "load_format": LOAD_FORMATS,
        "quantization": ("int8",),  # or None: what the checkpoint holds
        "activation_quantization": ACTIVATION_QUANTIZATION_CHOICES,
    }

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
            "data_parallel_rank",
        ):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool)):
                raise ValueError(f"{name} must be an integer, got {v!r}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        # The scheduler's own settings are validated by the Rust core, once.
        check_scheduler_args(
            self.block_size,
            self.max_num_seqs,
            self.max_num_batched_tokens,
            self.preemption_mode,
            self.allocation_policy,
        )
        for name, choices in self.CHOICES.items():
            if name in ("preemption_mode", "allocation_policy"):
                continue  # checked by check_scheduler_args
            v = getattr(self, name)
            if name == "quantization" and v is None:
                continue
            if v not in choices:
                raise ValueError(f"{name} must be one of {choices}, got {v!r}")
        if self.model_impl == "pagedrs" and self.tensor_parallel_size > 1:
            raise ValueError(
                "model_impl='pagedrs' runs whole layers on one rank; use 'auto' or "
                "'transformers' with tensor_parallel_size > 1"
            )
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {self.seed!r}")
        if self.device == "cuda" and not _torch().cuda.is_available():
            raise ValueError("device='cuda' but torch sees no CUDA GPU; use 'auto' or 'cpu'")
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")
        if self.num_gpu_blocks_override is not None and self.num_gpu_blocks_override < 1:
            raise ValueError("num_gpu_blocks_override must be >= 1")
        if self.kv_cache_memory_bytes is not None and self.kv_cache_memory_bytes < 1:
            raise ValueError("kv_cache_memory_bytes must be >= 1")
        if self.data_parallel_rank is not None and self.data_parallel_rank < 0:
            raise ValueError(f"data_parallel_rank must be >= 0, got {self.data_parallel_rank}")
        if self.max_logprobs < -1:
            raise ValueError(f"max_logprobs must be >= -1 (-1: no limit), got {self.max_logprobs}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization!r}"
            )
        if self.load_format == "dummy" and self.tensor_parallel_size > 1:
            raise ValueError("load_format='dummy' runs on one rank (tensor_parallel_size=1)")
        if not self.swap_space >= 0:
            raise ValueError(f"swap_space must be >= 0 GiB, got {self.swap_space}")
        self.kv_events()  # raises on a bad kv_events_config
        self.speculative()  # raises naming a bad speculative_config field
        # The attention backend must run this KV cache dtype (raises naming both).
        from ..attention.backends import BACKENDS
        from .batch_invariance import check_batch_invariant_args

        backend = self.resolved_attention_backend()
        BACKENDS[backend].check(self.cache_dtype(), self.torch_dtype(), self.torch_device())
        if self.batch_invariant:
            check_batch_invariant_args(self, backend)
        check_lora_args(self)  # LoRA (pagedrs.lora)

    def projections_batch_invariant(self) -> bool:
        """``batch_invariant``, or speculative decoding where batch invariance
        holds (``batch_invariance.projections_batch_invariant``)."""
        from .batch_invariance import projections_batch_invariant

        return projections_batch_invariant(self)

    @classmethod
    def field_docs(cls) -> dict[str, str]:
        """Each field's entry in the ``Attributes:`` section of the class docstring,
        continuation lines joined with spaces."""
        return field_docs(cls)

    @classmethod
    def add_cli_args(
        cls, parser: argparse.ArgumentParser, *, positional_model: bool = False
    ) -> argparse.ArgumentParser:
        """Add a flag ``--field-name`` for every field, in the group "engine
        arguments", ``choices`` from :attr:`CHOICES`: as
        ``cli_flags.add_dataclass_flags`` (its arguments, return value and
        errors)."""
        return add_dataclass_flags(
            cls, parser, cls.CHOICES, title="engine arguments", positional_model=positional_model
        )

    @classmethod
    def from_cli_args(cls, ns: argparse.Namespace) -> EngineArgs:
        """Engine arguments from a namespace parsed with :meth:`add_cli_args`' flags.

        Raises:
            ValueError: invalid values.
        """
        return cls(**{f.name: getattr(ns, f.name) for f in dataclasses.fields(cls)})

    def kv_events(self) -> KVEventsConfig | None:
        """``kv_events_config`` parsed, or None when not given.

        Raises:
            ValueError: invalid JSON or fields.
        """
        if self.kv_events_config is None:
            return None
        return KVEventsConfig.from_json(self.kv_events_config)

    def speculative(self) -> dict[str, Any] | None:
        """``speculative_config`` parsed and checked (every field, vLLM's
        defaults filled in), or None when speculation is off.

        Raises:
            ValueError: as ``spec_decode.parse_speculative_config``, naming
                the field.
        """
        return parse_speculative_config(self.speculative_config)

    def torch_device(self) -> torch.device:
        """The device to run on."""
        torch = _torch()
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def resolved_attention_backend(self) -> str:
        """The attention backend every rank runs: ``attention_backend``, or for
        "auto" "triton" on GPU and "cpu" (Rust kernels) on CPU where that
        backend runs the model dtype and ``kv_cache_dtype``, else "torch"."""
        from ..attention.backends import BACKENDS

        if self.attention_backend != "auto":
            return self.attention_backend
        device = self.torch_device()
        preferred = "triton" if device.type == "cuda" else "cpu"
        try:
            BACKENDS[preferred].check(self.cache_dtype(), self.torch_dtype(), device)
        except ValueError:
            return "torch"
        return preferred

    def cache_dtype(self) -> KVCacheDtype:
        """The KV cache's storage format: ``kv_cache_dtype`` for the model dtype.

        "auto" is the model's dtype, except for a float32 model on the CPU whose
        projections are quantized (``quantized_weights``): there it is bfloat16,
        2 bytes per value as llama.cpp's default f16 cache of the same file."""
        from ..attention.kv_cache_dtype import resolve_kv_cache_dtype

        th = _torch()
        if (
            self.kv_cache_dtype == "auto"
            and self.quantized_weights()
            and self.torch_device().type == "cpu"
            and self.torch_dtype() == th.float32
        ):
            return resolve_kv_cache_dtype("bfloat16", th.float32)
        return resolve_kv_cache_dtype(self.kv_cache_dtype, self.torch_dtype())

    def quantized_weights(self) -> bool:
        """Whether the projections run on quantized weights: a GGUF file (a
        packaged alias is one, as is a Hub reference ``org/repo:QUANT``) kept
        quantized, or ``quantization="int8"``."""
        from ..executor.gguf_hub import parse_hub_gguf

        if self.quantization is not None:
            return True
        return (
            self.model in PACKAGED_MODELS
            or self.model.lower().endswith(".gguf")
            or parse_hub_gguf(self.model) is not None
        )

    def torch_dtype(self) -> torch.dtype:
        """The model's dtype (and the KV cache's under ``kv_cache_dtype="auto"``)."""
        th = _torch()
        if self.dtype == "auto":
            return th.bfloat16 if self.torch_device().type == "cuda" else th.float32
        dtype: torch.dtype = getattr(th, _DTYPES[self.dtype])
        return dtype


def _torch() -> Any:
    """torch, imported when a method resolves a device or dtype: importing
    the configuration loads no model stack."""
    import torch

    return torch
