"""Loading and checking the draft model of ``speculative_config`` (method
``draft_model``), and its KV cache group in the target's spec.

The draft's layers form one full-attention KV cache group after the
target's groups, in the same block pool: a block id holds one layer of one
group per tensor pair, so the draft's layers need the target's page shape
(KV heads and head size) and use the pool's first tensor pairs. Every
refusal is a ``ValueError`` naming ``speculative_config.model`` (or the
field at fault).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..executor.kv_cache import KVCacheGroupSpec, KVCacheSpec, layer_sliding_windows
from ..executor.model_loader import load_model, local_model_path
from ..executor.model_runner import ModelRunner
from .draft_model import DraftModelProposer

if TYPE_CHECKING:
    from ..engine.arg_utils import EngineArgs

__all__ = ["build_drafter", "check_draft_config", "load_draft_model", "with_draft_group"]


def load_draft_model(args: EngineArgs, name: str) -> Any:
    """The draft model ``name`` (a path, GGUF file or id, as ``model``) in
    the engine's dtype on its device, attention routed to the paged backend.

    Raises:
        ValueError: ``tensor_parallel_size > 1`` (the draft runs in rank 0's
            process only: not built), or a model that cannot be loaded,
            naming ``speculative_config.model``.
    """
    if args.tensor_parallel_size > 1:
        raise ValueError(
            "speculative_config.method 'draft_model' is not supported with "
            f"tensor_parallel_size={args.tensor_parallel_size}; use tensor_parallel_size=1"
        )
    try:
        path = local_model_path(name, None, args.download_dir)
        return load_model(path, args.torch_dtype(), args.torch_device())
    except (ValueError, OSError) as exc:
        raise ValueError(f"speculative_config.model {name!r} cannot be loaded: {exc}") from exc


def check_draft_config(draft: Any, target: Any, spec: KVCacheSpec, name: str, max_len: int) -> None:
    """Refuse a draft model the engine cannot run beside the target.

    Args:
        draft, target: the two HF configs.
        spec: the target's KV cache spec (page shape).
        name: ``speculative_config.model`` as given.
        max_len: the engine's ``max_model_len``.
    Raises:
        ValueError: naming ``speculative_config.model``: a vocabulary size
            other than the target's (the draft must share its tokenizer),
            fewer positions than ``max_model_len``, sliding-window layers,
            or a page shape (KV heads, head size) other than the target's.
    """
    field = f"speculative_config.model {name!r}"
    dv, tv = int(draft.vocab_size), int(target.vocab_size)
    if dv != tv:
        raise ValueError(
            f"{field} has a vocabulary of {dv} tokens, the target {tv}: a draft model must "
            "share the target's tokenizer"
        )
    positions = getattr(draft, "max_position_embeddings", None)
    if positions is not None and positions < max_len:
        raise ValueError(f"{field} has {positions} positions, fewer than max_model_len={max_len}")
    if any(w is not None for w in layer_sliding_windows(draft)):
        raise ValueError(
            f"{field} has sliding-window layers: a draft model must use full attention"
        )
    heads = draft.num_attention_heads
    head_dim = getattr(draft, "head_dim", None) or draft.hidden_size // heads
    kv_heads = getattr(draft, "num_key_value_heads", None) or heads
    if (kv_heads, head_dim) != (spec.num_kv_heads, spec.head_dim):
        raise ValueError(
            f"{field} has {kv_heads} KV heads of size {head_dim}, the target "
            f"{spec.num_kv_heads} of size {spec.head_dim}: the draft's KV shares the "
            "target's block pool, whose pages have one shape"
        )


def with_draft_group(spec: KVCacheSpec, num_draft_layers: int) -> KVCacheSpec:
    """``spec`` plus one full-attention group of ``num_draft_layers`` layers
    numbered after the target's (the last group: the scheduler's
    ``kv_cache_groups`` and ``StepBatch.kv_groups`` gain one entry)."""
    n = spec.num_layers
    draft = KVCacheGroupSpec(None, tuple(range(n, n + num_draft_layers)))
    return KVCacheSpec(
        num_layers=n + num_draft_layers,
        num_kv_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        block_size=spec.block_size,
        dtype=spec.dtype,
        groups=(*spec.groups, draft),
        kv_cache_dtype=spec.kv_cache_dtype,
    )


def build_drafter(
    args: EngineArgs, draft: Any, target: Any, spec: KVCacheSpec, max_model_len: int
) -> DraftModelProposer:
    """The proposer running ``draft`` on ``target``'s pool (a ``ModelRunner``),
    its KV in ``spec``'s last group.

    Raises:
        ValueError: a target executor other than the in-process runner.
    """
    if not isinstance(target, ModelRunner):
        raise ValueError(
            "speculative_config.method 'draft_model' needs the in-process model runner "
            f"(got {type(target).__name__})"
        )
    group = spec.groups[-1]
    own = KVCacheSpec(
        num_layers=len(group.layers),
        num_kv_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        block_size=spec.block_size,
        dtype=spec.dtype,
        kv_cache_dtype=spec.kv_cache_dtype,
    )
    runner = ModelRunner(
        draft,
        own,
        0,
        target.device,
        attention_backend=args.resolved_attention_backend(),
        max_model_len=max_model_len,
        batch_invariant=args.projections_batch_invariant(),
    )
    return DraftModelProposer(runner, target, len(spec.groups) - 1, args.seed)
