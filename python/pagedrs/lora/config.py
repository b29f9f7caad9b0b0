"""The LoRA fields of ``EngineArgs`` (``enable_lora``, ``max_loras``,
``max_lora_rank``, ``max_cpu_loras``), checked once, naming the field."""

from __future__ import annotations

from typing import Any

__all__ = ["check_lora_args", "cpu_loras"]


def cpu_loras(args: Any) -> int:
    """``max_cpu_loras``, or ``max_loras`` when None (vLLM's default)."""
    return args.max_cpu_loras if args.max_cpu_loras is not None else args.max_loras


def check_lora_args(args: Any) -> None:
    """Raise unless ``args``' LoRA fields are consistent.

    Raises:
        ValueError: naming the field: a non-positive ``max_loras`` /
            ``max_lora_rank``, ``max_cpu_loras`` below ``max_loras``, or
            ``enable_lora`` with what LoRA does not run with: a device other
            than the CPU, ``tensor_parallel_size`` > 1, or a second model for
            speculative decoding (the draft model has no adapters).
    """
    for name in ("max_loras", "max_lora_rank"):
        v = getattr(args, name)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if args.max_cpu_loras is not None:
        v = args.max_cpu_loras
        if not isinstance(v, int) or isinstance(v, bool) or v < args.max_loras:
            raise ValueError(
                f"max_cpu_loras must be an integer >= max_loras ({args.max_loras}), got {v!r}"
            )
    if not args.enable_lora:
        return
    if args.torch_device().type != "cpu":
        raise ValueError(
            "enable_lora runs on the CPU (the Rust LoRA kernel); device "
            f"{args.torch_device().type!r} is not supported"
        )
    if args.tensor_parallel_size > 1:
        raise ValueError("enable_lora needs tensor_parallel_size=1 (adapters are not sharded)")
    spec = args.speculative()
    if spec is not None and spec.get("method") == "draft_model":
        raise ValueError(
            "enable_lora with speculative_config method 'draft_model' is not supported "
            "(the draft model has no adapters)"
        )
