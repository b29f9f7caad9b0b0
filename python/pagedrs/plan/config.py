"""One configuration the planner simulates: the engine's scheduler settings
(vLLM's names, as ``EngineArgs``), the numerics that set step times and KV
size, and the deployment (tensor-parallel size, data-parallel replicas and
their router).
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

__all__ = ["ROUTERS", "PlanConfig", "expand_configs"]

#: Routers in front of data-parallel replicas: "pagedrs" (the prefix-cache
#: rule of ``pagedrs.serve.routing``: ``choose_replica`` over a
#: ``PrefixCacheIndex`` fed by the replicas' KV events), "power_of_two" (Ray
#: Serve's default: the shorter queue of two random replicas), "round_robin".
ROUTERS = ("pagedrs", "power_of_two", "round_robin")


@dataclass(frozen=True)
class PlanConfig:
    """Settings of one simulated deployment.

    Attributes:
        block_size: tokens per KV block.
        max_num_seqs: sequences per step.
        max_num_batched_tokens: token budget per step (None: 2048 with chunked
            prefill, else ``max_model_len``, as the engine).
        max_model_len: longest sequence (None: the model's positions).
        enable_chunked_prefill, enable_prefix_caching, preemption_mode,
        allocation_policy, scheduling_policy: as ``EngineArgs``
            (allocation policies "paged", "reserve-max" / "reserve-pow2" /
            "reserve-oracle": the paper's Orca baselines, "static").
        num_cpu_blocks: swap space in blocks (``preemption_mode="swap"``).
        num_gpu_blocks: KV blocks per replica (None: from the profile's memory).
        dtype: compute dtype; weight_dtype: weight format (None: ``dtype``);
        kv_cache_dtype: KV cache dtype.
        tensor_parallel_size: devices per replica.
        data_parallel_size: replicas.
        router: how requests reach replicas (``ROUTERS``).
    """

    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    preemption_mode: str = "recompute"
    allocation_policy: str = "paged"
    scheduling_policy: str = "fcfs"
    num_cpu_blocks: int = 0
    num_gpu_blocks: int | None = None
    dtype: str = "bfloat16"
    weight_dtype: str | None = None
    kv_cache_dtype: str = "auto"
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    router: str = "pagedrs"

    def __post_init__(self) -> None:
        if self.router not in ROUTERS:
            raise ValueError(f"router must be one of {list(ROUTERS)}, got {self.router!r}")
        if self.data_parallel_size < 1:
            raise ValueError(f"data_parallel_size must be >= 1, got {self.data_parallel_size}")
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")

    def as_dict(self) -> dict[str, Any]:
        """Every field by name."""
        return asdict(self)

    def label(self, base: PlanConfig | None = None) -> str:
        """The fields that differ from ``base`` (default: the defaults), as
        ``name=value`` pairs; "default" when none do."""
        ref = base or PlanConfig()
        diff = [
            f"{f.name}={getattr(self, f.name)}"
            for f in fields(self)
            if getattr(self, f.name) != getattr(ref, f.name)
        ]
        return ",".join(diff) or "default"


def expand_configs(base: PlanConfig, axes: dict[str, list[Any]]) -> list[PlanConfig]:
    """Every combination of the values in ``axes`` (field -> values) over ``base``.

    Raises:
        ValueError: an unknown field, naming it.
    """
    names = {f.name for f in fields(PlanConfig)}
    for k in axes:
        if k not in names:
            raise ValueError(f"unknown configuration field {k!r} (fields: {sorted(names)})")
    keys = list(axes)
    return [
        replace(base, **dict(zip(keys, combo, strict=True)))
        for combo in itertools.product(*(axes[k] for k in keys))
    ]
