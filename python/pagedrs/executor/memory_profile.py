"""KV cache budget from GPU memory (``gpu_memory_utilization``), as vLLM does:
load the weights, run a profiling forward of ``max_num_batched_tokens``
tokens, and give the KV cache what is left of the engine's share.

    kv_bytes = utilization * total
               - in use at start (other processes, this process' CUDA context)
               - weights
               - peak activations of the profiling forward (and its logits)
               - memory the forward took outside torch's allocator (cuBLAS
                 workspaces, Triton modules)

The device memory figures come from a ``DeviceMemory`` (``CudaMemory`` on a
GPU), so tests check the arithmetic with a stand-in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch


class DeviceMemory(Protocol):
    """The memory queries the budget needs (bytes)."""

    def mem_get_info(self) -> tuple[int, int]:
        """(free, total) of the whole device, all processes."""
        ...

    def memory_allocated(self) -> int:
        """Bytes held by this process' tensors now."""
        ...

    def max_memory_allocated(self) -> int:
        """Peak of ``memory_allocated`` since ``reset_peak``."""
        ...

    def memory_reserved(self) -> int:
        """Bytes torch's caching allocator holds (tensors and cache)."""
        ...

    def reset_peak(self) -> None:
        """Restart the peak of ``max_memory_allocated``."""
        ...

    def empty_cache(self) -> None:
        """Return the allocator's unused cached blocks to the device."""
        ...


class CudaMemory:
    """``DeviceMemory`` of one CUDA device (``torch.cuda``)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def mem_get_info(self) -> tuple[int, int]:
        free, total = torch.cuda.mem_get_info(self.device)
        return int(free), int(total)

    def memory_allocated(self) -> int:
        return int(torch.cuda.memory_allocated(self.device))

    def max_memory_allocated(self) -> int:
        return int(torch.cuda.max_memory_allocated(self.device))

    def memory_reserved(self) -> int:
        return int(torch.cuda.memory_reserved(self.device))

    def reset_peak(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)

    def empty_cache(self) -> None:
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()


@dataclass(frozen=True)
class StartSnapshot:
    """Device memory before the engine loads anything (bytes)."""

    free: int
    total: int
    allocated: int

    @classmethod
    def take(cls, mem: DeviceMemory) -> StartSnapshot:
        free, total = mem.mem_get_info()
        return cls(free, total, mem.memory_allocated())


@dataclass(frozen=True)
class KVBudget:
    """The figures of a KV cache budget (bytes), logged at start."""

    total: int
    utilization: float
    in_use_at_start: int
    weights: int
    activations: int
    non_torch: int
    kv_cache: int

    def describe(self) -> str:
        gib = 1 << 30
        return (
            f"{self.utilization:.2f} x {self.total / gib:.2f} GiB total - "
            f"{self.in_use_at_start / gib:.2f} GiB in use at start - "
            f"{self.weights / gib:.2f} GiB weights - "
            f"{self.activations / gib:.2f} GiB peak activations - "
            f"{self.non_torch / gib:.2f} GiB outside torch = "
            f"{self.kv_cache / gib:.2f} GiB KV cache"
        )


def kv_cache_budget(
    start: StartSnapshot,
    utilization: float,
    weights: int,
    activations: int,
    non_torch: int,
) -> KVBudget:
    """The KV cache's bytes (module docs' formula).

    Raises:
        ValueError: nothing left for the KV cache, with the figures.
    """
    in_use = start.total - start.free
    kv = int(utilization * start.total) - in_use - weights - activations - max(0, non_torch)
    budget = KVBudget(start.total, utilization, in_use, weights, activations, max(0, non_torch), kv)
    if kv <= 0:
        raise ValueError(
            "no GPU memory left for the KV cache: "
            + budget.describe()
            + "; raise gpu_memory_utilization, lower max_num_batched_tokens, or set "
            "kv_cache_memory_bytes / num_gpu_blocks_override"
        )
    return budget


def profile_kv_budget(
    mem: DeviceMemory,
    start: StartSnapshot,
    utilization: float,
    profile: Callable[[], object],
) -> KVBudget:
    """Run ``profile()`` (the profiling forward) and size the KV cache. The
    weights are what the engine's tensors hold before the forward (the
    model, fused copies of its weights, the profile's few KV blocks).

    Args:
        mem: the device's memory queries.
        start: the snapshot taken before the model loaded.
        utilization: ``gpu_memory_utilization``.
        profile: runs the forward of ``max_num_batched_tokens`` tokens.
    Raises:
        ValueError: as ``kv_cache_budget``.
    """
    mem.empty_cache()
    before_alloc = mem.memory_allocated()
    weights = max(0, before_alloc - start.allocated)
    free_before, _ = mem.mem_get_info()
    reserved_before = mem.memory_reserved()
    mem.reset_peak()
    profile()
    peak = mem.max_memory_allocated()
    free_after, _ = mem.mem_get_info()
    reserved_after = mem.memory_reserved()
    activations = max(0, peak - before_alloc)
    # Device memory the forward took beyond what the allocator reserved.
    non_torch = (free_before - free_after) - (reserved_after - reserved_before)
    mem.empty_cache()
    return kv_cache_budget(start, utilization, weights, activations, non_torch)
