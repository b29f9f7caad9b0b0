"""Building an engine's parts from ``EngineArgs``: tokenizer, model, context
length, KV cache size, the Rust scheduler, and the executor."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import pagedrs._core as _core

from ...executor.gguf_metadata import shared_gguf_metadata
from ...executor.interface import Executor
from ...executor.kv_cache import KVCacheSpec
from ...executor.memory_profile import CudaMemory, DeviceMemory, StartSnapshot, profile_kv_budget
from ...executor.model_loader import load_model, load_tokenizer, local_model_path
from ...executor.model_runner import ModelRunner, profile_blocks
from ...executor.model_support import check_tensor_parallel
from ...executor.quant.memory import weight_nbytes
from ...kv_events import EventPublisher, make_publisher
from ...lora.config import cpu_loras
from ...scheduler_setup import build_scheduler, token_budget
from ...spec_decode import DRAFT_MODEL
from ...spec_decode.cost_model import measure_draft_step_costs
from ..arg_utils import EngineArgs

logger = logging.getLogger(__name__)

#: KV budget when neither ``kv_cache_memory_bytes`` nor
#: ``num_gpu_blocks_override`` is given, on CPU (vLLM's CPU backend default)
#: and under tensor parallelism (GPU memory is not profiled across ranks).
DEFAULT_KV_CACHE_BYTES = 4 << 30


@dataclass
class EngineParts:
    """What ``LLMEngine`` runs on.

    Attributes:
        tokenizer: the HF tokenizer.
        model: the loaded HF model (rank 0's shard under tensor parallelism).
        max_model_len: longest sequence, tokens.
        kv_spec: the whole model's KV cache spec (all ranks) and its KV cache
            groups.
        scheduler: the Rust scheduler over ``num_blocks`` device blocks.
        executor: runs steps on the model (in process or tensor-parallel).
        kv_events: publishes the scheduler's prefix-cache events after each
            step, or None when ``kv_events_config`` leaves them off.
        weight_bytes: bytes this process's weights hold (``model_weight_bytes``),
            a draft model's included.
        drafter: the draft model's proposer (``speculative_config`` method
            ``draft_model``), or None.
        lora: the ``LoRAModelManager`` with ``enable_lora``, else None.
    """

    tokenizer: Any
    model: Any
    max_model_len: int
    kv_spec: KVCacheSpec
    scheduler: _core.Scheduler
    executor: Executor
    kv_events: EventPublisher | None = None
    weight_bytes: int = 0
    drafter: Any = None
    lora: Any = None


def model_weight_bytes(model: Any, executor: Executor) -> int:
    """Bytes the weights hold in this process: the model's float parameters
    and buffers, quantized weights as stored (GGUF blocks, int8 and their
    scales) and the executor's oneDNN-packed copies, each storage once
    (``quant.memory.weight_nbytes``). Under tensor parallelism: rank 0's shard."""
    native = getattr(executor, "native", None)
    packed = native.packed_weights() if native is not None else []
    return weight_nbytes(model, packed)


def resolve_max_model_len(args: EngineArgs, config: Any) -> int:
    """``args.max_model_len`` or the model's positions.

    Raises:
        ValueError: more than the model's positions.
    """
    model_max = getattr(config, "max_position_embeddings", None) or 2048
    if args.max_model_len is not None and args.max_model_len > model_max:
        raise ValueError(
            f"max_model_len={args.max_model_len} exceeds the model's {model_max} positions"
        )
    return args.max_model_len or model_max


def kv_cache_blocks(args: EngineArgs, spec: KVCacheSpec, lora_bytes: int = 0) -> tuple[int, int]:
    """(device blocks, CPU swap blocks) for the KV budget of ``args`` (one block
    id costs ``spec.bytes_per_block``: ``group_size`` layers' keys and values
    in the KV cache dtype, int8 scales included), less ``lora_bytes`` set
    aside for LoRA adapters (``lora.memory``); ``num_gpu_blocks_override``
    is taken as given.

    Raises:
        ValueError: ``lora_bytes`` leaves no block of the budget, naming the
            fields that size them.
    """
    if args.num_gpu_blocks_override is not None:
        num_blocks = args.num_gpu_blocks_override
    else:
        budget = args.kv_cache_memory_bytes or DEFAULT_KV_CACHE_BYTES
        num_blocks = spec.num_blocks(max(0, budget - lora_bytes))
        if lora_bytes and num_blocks == 0:
            raise ValueError(
                f"enable_lora: the adapters may take {_gib(lora_bytes)} (max_cpu_loras="
                f"{cpu_loras(args)} loaded + max_loras={args.max_loras} "
                f"slots at max_lora_rank={args.max_lora_rank} on every projection), which "
                f"leaves no KV cache block of the {_gib(budget)} budget "
                "(kv_cache_memory_bytes): raise it or lower those fields"
            )
    num_cpu_blocks = 0
    if args.preemption_mode == "swap":
        num_cpu_blocks = int(args.swap_space * (1 << 30)) // spec.bytes_per_block
    return num_blocks, num_cpu_blocks


def build_executor(
    args: EngineArgs,
    model: Any,
    spec: KVCacheSpec,
    num_blocks: int,
    num_cpu_blocks: int,
    max_model_len: int,
    model_path: str | None = None,
) -> Executor:
    """The in-process ``ModelRunner``, or a ``TensorParallelRunner`` when
    ``tensor_parallel_size > 1``; both run ``args.resolved_attention_backend()``.

    Args:
        model_path: the local path the workers load (default ``args.model``).
    Raises:
        ValueError: tensor parallelism for an architecture the sharding does
            not handle, or for quantized weights.
    """
    backend = args.resolved_attention_backend()
    device, dtype = args.torch_device(), args.torch_dtype()
    if args.tensor_parallel_size > 1:
        from ...distributed.sharding import refuse_quantized
        from ...distributed.tp_runner import TensorParallelRunner
        from ...distributed.worker import ShardConfig

        check_tensor_parallel(model.config, args.tensor_parallel_size)
        refuse_quantized(model, args.tensor_parallel_size)
        config = ShardConfig(
            model_path or args.model,
            dtype,
            device,
            args.block_size,
            num_blocks,
            num_cpu_blocks,
            backend,
            args.tensor_parallel_size,
            spec.groups,
            spec.kv_cache_dtype,
        )
        return TensorParallelRunner(model, config)
    return build_model_runner(args, model, spec, num_blocks, num_cpu_blocks, max_model_len)


def build_model_runner(
    args: EngineArgs,
    model: Any,
    spec: KVCacheSpec,
    num_blocks: int,
    num_cpu_blocks: int,
    max_model_len: int,
) -> ModelRunner:
    """The in-process ``ModelRunner`` (``tensor_parallel_size == 1``) on
    ``args.resolved_attention_backend()``, with ``args``' model implementation
    and projection batch invariance."""
    return ModelRunner(
        model,
        spec,
        num_blocks,
        args.torch_device(),
        attention_backend=args.resolved_attention_backend(),
        num_cpu_blocks=num_cpu_blocks,
        model_impl=args.model_impl,
        max_model_len=max_model_len,
        batch_invariant=args.projections_batch_invariant(),
    )


def device_memory(device: Any) -> DeviceMemory | None:
    """The memory queries of ``device`` for ``gpu_memory_utilization``: a
    ``CudaMemory`` on a GPU, None elsewhere (tests substitute a stand-in)."""
    return CudaMemory(device) if device.type == "cuda" else None


def uses_cuda_graphs(args: EngineArgs) -> bool:
    """Decode steps replay CUDA graphs: on a GPU, one rank, unless
    ``enforce_eager`` (on CPU steps are always eager)."""
    return (
        args.torch_device().type == "cuda"
        and not args.enforce_eager
        and args.tensor_parallel_size == 1
    )


def warn_float_projections(model: Any) -> None:
    """Log a warning when speculative decoding runs a model with float
    projections (``torch.nn.Linear``): torch's float32 and float16 matmuls
    give a row different last bits at different row counts, so a verify step
    of K+1 rows can flip a greedy near-tie against K+1 one-row steps (outputs
    stay samples of the model, but not token for token those without
    speculation). Quantized weights (GGUF, ``quantization="int8"``) run the
    Rust kernels, whose integer sums are the same bits in any batch."""
    import torch

    linear = next(
        (name for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)), None
    )
    if linear is not None:
        logger.warning(
            "speculative_config with float projections (%s is a torch.nn.Linear): a verify "
            "step's rows are not batch-invariant, so greedy near-ties may differ from "
            "decoding without speculation; quantized weights (a .gguf model or "
            "quantization='int8') are batch-invariant",
            linear,
        )


def eos_token_ids(model: Any, tokenizer: Any) -> list[int]:
    """The tokens that end generation: the model's ``generation_config``
    ``eos_token_id`` (an int or a list), else the tokenizer's; none if neither
    has one."""
    eos = getattr(model.generation_config, "eos_token_id", None)
    if eos is None:
        eos = tokenizer.eos_token_id
    if eos is None:
        return []
    return [eos] if isinstance(eos, int) else list(eos)


def build_engine_parts(args: EngineArgs) -> EngineParts:
    """Load the model and tokenizer, size the KV cache (on a GPU from
    ``gpu_memory_utilization`` after a profiling forward, unless
    ``kv_cache_memory_bytes`` or ``num_gpu_blocks_override`` says), build the
    executor and the scheduler (which validates its settings), and capture
    the CUDA graphs.

    Raises:
        ValueError: an unknown model, an architecture pagedrs refuses, a context
            over the model's positions, no GPU memory left for the KV cache, or
            a KV cache too small for one sequence of ``max_model_len`` tokens.
    """
    dtype, device = args.torch_dtype(), args.torch_device()
    mem = device_memory(device)
    profile = (
        mem is not None
        and args.tensor_parallel_size == 1
        and args.kv_cache_memory_bytes is None
        and args.num_gpu_blocks_override is None
    )
    start = StartSnapshot.take(mem) if profile and mem is not None else None
    model_path = local_model_path(args.model, args.revision, args.download_dir)
    with shared_gguf_metadata():  # a GGUF's metadata parsed once for config and tokenizer
        model = load_model(  # refusals come first
            model_path,
            dtype,
            device,
            load_format=args.load_format,
            quantization=args.quantization,
            activation_quantization=args.activation_quantization,
        )
        max_model_len = resolve_max_model_len(args, model.config)
        spec = KVCacheSpec.from_config(
            model.config,
            args.block_size,
            dtype,
            hybrid=not args.disable_hybrid_kv_cache_manager,
            kv_cache_dtype=args.kv_cache_dtype,
        )
        draft = None
        spec_cfg = args.speculative()
        if spec_cfg is not None and spec_cfg["method"] == DRAFT_MODEL:
            from ...spec_decode.draft_setup import (
                check_draft_config,
                load_draft_model,
                with_draft_group,
            )

            draft = load_draft_model(args, spec_cfg["model"])
            check_draft_config(draft.config, model.config, spec, spec_cfg["model"], max_model_len)
            spec = with_draft_group(spec, int(draft.config.num_hidden_layers))
        tokenizer = load_tokenizer(model_path, args.tokenizer, args.revision, args.download_dir)
    budget = token_budget(args, max_model_len)
    lora_bytes = _lora_reserved_bytes(args, model)
    num_blocks, num_cpu_blocks = kv_cache_blocks(args, spec, lora_bytes)
    if start is not None and mem is not None:
        # Profiled only with tensor_parallel_size == 1: the in-process runner.
        blocks = profile_blocks(budget, max_model_len, args.block_size)
        runner = build_model_runner(args, model, spec, blocks, num_cpu_blocks, max_model_len)
        executor: Executor = runner
        try:
            figures = profile_kv_budget(
                mem,
                start,
                args.gpu_memory_utilization,
                lambda: runner.profile_run(budget, args.max_num_seqs, max_model_len),
            )
            num_blocks = figures.kv_cache // spec.bytes_per_block
            logger.info(
                "GPU memory (gpu_memory_utilization=%.2f, profiled with %d tokens): %s",
                args.gpu_memory_utilization,
                budget,
                figures.describe(),
            )
            runner.resize_kv_cache(num_blocks)
        except Exception:
            executor.close()
            raise
    else:
        executor = build_executor(
            args, model, spec, num_blocks, num_cpu_blocks, max_model_len, model_path
        )
    weight_bytes = model_weight_bytes(model, executor)
    drafter = None
    if draft is not None:
        from ...spec_decode.draft_setup import build_drafter

        try:
            drafter = build_drafter(args, draft, executor, spec, max_model_len)
        except Exception:
            executor.close()
            raise
        weight_bytes += model_weight_bytes(draft, drafter.runner)
    logger.info(
        "Memory: weights %s, KV cache %s in %d blocks of %d tokens (%s, %d bytes each, "
        "all free at start), %d KV cache groups of up to %d layers: %s%s",
        _gib(weight_bytes),
        _gib(num_blocks * spec.bytes_per_block),
        num_blocks,
        args.block_size,
        spec.cache_dtype.name,
        spec.bytes_per_block,
        len(spec.groups),
        spec.group_size,
        spec.describe(),
        f"; LoRA adapters up to {_gib(lora_bytes)}, set aside from the KV budget"
        if lora_bytes
        else "",
    )
    if args.speculative_config is not None and not args.projections_batch_invariant():
        warn_float_projections(model)
    events = args.kv_events()
    if events is not None and events.active and not args.enable_prefix_caching:
        logger.warning("kv_events_config: no events without enable_prefix_caching")
    try:
        scheduler = build_scheduler(
            args,
            num_blocks,
            max_model_len,
            num_cpu_blocks=num_cpu_blocks,
            kv_cache_groups=spec.sliding_windows,
            enable_kv_cache_events=events is not None and events.active,
            speculative_config=args.speculative(),
        )
        if uses_cuda_graphs(args) and isinstance(executor, ModelRunner):
            executor.capture_cuda_graphs(args.max_num_seqs, max_model_len)
        speculative = args.speculative()
        if (
            speculative is not None
            and speculative["draft_length_policy"] == "goodput"
            and speculative["draft_step_costs"] is None
        ):
            scheduler.set_draft_step_costs(
                measure_draft_step_costs(
                    executor,
                    device=device,
                    block_size=args.block_size,
                    num_blocks=num_blocks,
                    num_groups=len(spec.groups),
                    max_num_seqs=args.max_num_seqs,
                    max_num_batched_tokens=budget,
                    max_model_len=max_model_len,
                    num_speculative_tokens=speculative["num_speculative_tokens"],
                )
            )
        publisher = make_publisher(events, device.type, args.data_parallel_rank)
        lora = _lora_manager(args, executor, scheduler, lora_bytes)
    except Exception:
        executor.close()
        raise
    return EngineParts(
        tokenizer,
        model,
        max_model_len,
        spec,
        scheduler,
        executor,
        publisher,
        weight_bytes,
        drafter,
        lora,
    )


def _lora_reserved_bytes(args: EngineArgs, model: Any) -> int:
    """LoRA (pagedrs.lora): with ``enable_lora``, the bytes set aside for
    adapters from the KV budget (``lora.memory``); else 0."""
    if not args.enable_lora:
        return 0
    from ...lora.memory import lora_reserved_bytes

    return lora_reserved_bytes(model, args.max_loras, args.max_lora_rank, cpu_loras(args))


def _lora_manager(
    args: EngineArgs, executor: Executor, scheduler: _core.Scheduler, reserved_bytes: int
) -> Any:
    """LoRA (pagedrs.lora): with ``enable_lora``, the adapters' manager over
    the executor's model and the scheduler's ``max_loras`` bound; else None."""
    if not args.enable_lora:
        return None
    from ...lora.manager import LoRAModelManager

    scheduler.set_max_loras(args.max_loras)
    return LoRAModelManager(
        executor, args.max_loras, args.max_lora_rank, cpu_loras(args), reserved_bytes
    )


def _gib(n: int) -> str:
    """``n`` bytes as "<n> bytes (<x> GiB)"."""
    return f"{n} bytes ({n / 2**30:.2f} GiB)"
