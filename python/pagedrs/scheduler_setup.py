"""The Rust scheduler built from a configuration: one function for the engine
core (``engine.core.setup``, from ``EngineArgs``) and the capacity planner
(``plan.simulator``, from ``PlanConfig``), and the one token-budget rule.
Imports no model stack."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import pagedrs._core as _core

__all__ = ["SchedulerSettings", "build_scheduler", "token_budget"]

#: Tokens per step with chunked prefill and no ``max_num_batched_tokens``.
CHUNKED_PREFILL_BUDGET = 2048


class SchedulerSettings(Protocol):
    """The scheduler's fields of ``EngineArgs`` and ``PlanConfig`` (read only)."""

    @property
    def block_size(self) -> int: ...

    @property
    def max_num_seqs(self) -> int: ...

    @property
    def max_num_batched_tokens(self) -> int | None: ...

    @property
    def enable_chunked_prefill(self) -> bool: ...

    @property
    def enable_prefix_caching(self) -> bool: ...

    @property
    def preemption_mode(self) -> str: ...

    @property
    def allocation_policy(self) -> str: ...

    @property
    def scheduling_policy(self) -> str: ...


def token_budget(settings: SchedulerSettings, max_model_len: int) -> int:
    """Tokens one step may schedule: ``max_num_batched_tokens``, else 2048
    with chunked prefill, else ``max_model_len`` (a whole prompt per step)."""
    if settings.max_num_batched_tokens is not None:
        return settings.max_num_batched_tokens
    return CHUNKED_PREFILL_BUDGET if settings.enable_chunked_prefill else max_model_len


def build_scheduler(
    settings: SchedulerSettings,
    num_blocks: int,
    max_model_len: int,
    *,
    num_cpu_blocks: int = 0,
    kv_cache_groups: Sequence[int | None] | None = None,
    enable_kv_cache_events: bool = False,
    speculative_config: dict[str, Any] | None = None,
) -> _core.Scheduler:
    """A ``_core.Scheduler`` over ``num_blocks`` device blocks.

    Args:
        settings: the scheduling fields (``EngineArgs``, ``PlanConfig``).
        num_blocks: device KV blocks.
        max_model_len: the longest sequence, in tokens.
        num_cpu_blocks: CPU swap blocks (``preemption_mode="swap"``).
        kv_cache_groups: each KV cache group's sliding window (None: full
            attention); default one full-attention group.
        enable_kv_cache_events: record prefix-cache events.
        speculative_config: parsed ``speculative_config``, or None.
    Raises:
        ValueError: settings the Rust core refuses (``SchedulerConfig::validate``).
    """
    return _core.Scheduler(
        num_blocks,
        settings.block_size,
        settings.max_num_seqs,
        token_budget(settings, max_model_len),
        max_model_len,
        enable_chunked_prefill=settings.enable_chunked_prefill,
        enable_prefix_caching=settings.enable_prefix_caching,
        num_cpu_blocks=num_cpu_blocks,
        preemption_mode=settings.preemption_mode,
        allocation_policy=settings.allocation_policy,
        kv_cache_groups=None if kv_cache_groups is None else list(kv_cache_groups),
        scheduling_policy=settings.scheduling_policy,
        enable_kv_cache_events=enable_kv_cache_events,
        speculative_config=speculative_config,
    )
