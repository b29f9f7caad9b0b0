"""Where the engine's float projections run batch-invariant (each row's bits
the same whatever the other rows of the step): ``EngineArgs.batch_invariant``,
and speculative decoding, whose verify step of K+1 rows must give the tokens
of K+1 one-row steps."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..executor.models.linear import check_batch_invariant

if TYPE_CHECKING:
    from .arg_utils import EngineArgs

__all__ = ["check_batch_invariant_args", "projections_batch_invariant"]


def projections_batch_invariant(args: EngineArgs) -> bool:
    """Whether the model's float projections run batch-invariant:
    ``batch_invariant``, or speculative decoding on a model where batch
    invariance holds (where it cannot, e.g. bfloat16 without oneDNN packing
    or a GPU, the engine logs a warning instead)."""
    if args.batch_invariant:
        return True
    if args.speculative_config is None:
        return False
    try:
        check_batch_invariant_args(args, args.resolved_attention_backend())
    except ValueError:
        return False
    return True


def check_batch_invariant_args(args: EngineArgs, backend: str) -> None:
    """Refuse batch invariance where it cannot hold, naming the field.

    Raises:
        ValueError: another device or dtype (``check_batch_invariant``),
            tensor parallelism, or an attention backend other than "cpu".
    """
    check_batch_invariant(args.torch_dtype(), args.torch_device(), f"dtype={args.dtype!r}")
    if args.tensor_parallel_size > 1:
        raise ValueError(
            "batch_invariant: tensor_parallel_size > 1 is not covered (sharded "
            "projections run torch's matmuls); use tensor_parallel_size=1"
        )
    if backend != "cpu":
        raise ValueError(
            f"batch_invariant: attention_backend={backend!r} is not batch-invariant; "
            "use attention_backend='cpu' (the Rust kernels)"
        )
