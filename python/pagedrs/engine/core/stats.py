"""The engine's counters: the Rust scheduler's, with each KV cache group's layers
and the KV cache's bytes."""

from __future__ import annotations

from typing import Any

import pagedrs._core as _core

from ...executor.kv_cache import KVCacheSpec


def engine_stats(
    scheduler: _core.Scheduler,
    kv_spec: KVCacheSpec,
    worker_kv_spec: KVCacheSpec,
    weight_bytes: int = 0,
) -> dict[str, Any]:
    """Block pool and scheduler counters.

    Keys: the fields of ``pagedrs._core.KVCacheStats`` (num_total_blocks,
    num_free_blocks, num_used_blocks, num_cached_blocks, num_evicted_blocks,
    num_cpu_blocks, num_free_cpu_blocks, num_preemptions, num_swapped_out,
    num_swapped_in (blocks), prefix_cache_queries, prefix_cache_hits
    (tokens), num_waiting, num_running, num_swapped, num_steps, block_size,
    num_token_states, num_table_blocks, num_allocated_slots,
    kv_cache_utilization (token states / allocated slots),
    allocation_policy, and groups: one dict per KV cache group, in the
    order of ``kv_spec.groups``, with sliding_window (tokens, None: full
    attention), num_used_blocks, num_token_states, num_allocated_slots,
    kv_cache_utilization, plus layers (the group's model layers)), plus
    kv_cache_dtype (its name), bytes_per_block (all ranks; one block id
    across the pool's ``group_size`` layers, scales included) and
    kv_cache_bytes_per_worker (bytes of the KV tensors one rank holds),
    and the memory in bytes: weight_bytes (the weights as held, quantized
    ones as stored: ``setup.model_weight_bytes``), kv_cache_total_bytes (all
    device blocks, all ranks), kv_cache_used_bytes (the used blocks) and
    kv_cache_free_bytes (the KV budget left: the free blocks).

    Args:
        kv_spec: the whole model's KV cache layout.
        worker_kv_spec: one tensor-parallel rank's (``kv_spec`` on one rank).
        weight_bytes: the weights' bytes.
    """
    stats = scheduler.stats().as_dict()
    groups = [dict(g) for g in stats["groups"]]
    for group, spec in zip(groups, kv_spec.groups, strict=True):
        group["layers"] = list(spec.layers)
    stats["groups"] = groups
    stats["kv_cache_dtype"] = kv_spec.cache_dtype.name
    stats["bytes_per_block"] = kv_spec.bytes_per_block
    stats["kv_cache_bytes_per_worker"] = worker_kv_spec.bytes_per_block * stats["num_total_blocks"]
    stats["weight_bytes"] = weight_bytes
    for key, blocks in (
        ("kv_cache_total_bytes", "num_total_blocks"),
        ("kv_cache_used_bytes", "num_used_blocks"),
        ("kv_cache_free_bytes", "num_free_blocks"),
    ):
        stats[key] = kv_spec.bytes_per_block * stats[blocks]
    return stats
