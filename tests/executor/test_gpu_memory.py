"""``gpu_memory_utilization``: the KV cache budget's arithmetic, and the
engine's start-up path (load, profiling forward, resize) driven on CPU by a
stand-in for the GPU's memory queries."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from pagedrs import LLM, EngineArgs, SamplingParams
from pagedrs.engine.core import setup
from pagedrs.executor.memory_profile import StartSnapshot, kv_cache_budget, profile_kv_budget

GIB = 1 << 30


class FakeMemory:
    """Device memory figures as a test scripts them: tensors allocated grow by
    ``weights`` when the model loads and peak ``activations`` above that in
    the profiling forward, which also takes ``non_torch`` bytes outside the
    allocator."""

    def __init__(self, total: int, free: int, activations: int, non_torch: int = 0) -> None:
        self.total, self.free = total, free
        self.allocated = self.peak = self.reserved = 0
        self.activations, self.non_torch = activations, non_torch
        self.profiled = 0

    def mem_get_info(self) -> tuple[int, int]:
        return self.free, self.total

    def memory_allocated(self) -> int:
        return self.allocated

    def max_memory_allocated(self) -> int:
        return self.peak

    def memory_reserved(self) -> int:
        return self.reserved

    def reset_peak(self) -> None:
        self.peak = self.allocated

    def empty_cache(self) -> None:
        pass

    def load(self, nbytes: int) -> None:
        self.allocated += nbytes
        self.reserved += nbytes
        self.free -= nbytes

    def forward(self) -> None:
        self.profiled += 1
        self.peak = self.allocated + self.activations
        self.reserved += self.activations
        self.free -= self.activations + self.non_torch


def test_budget_arithmetic() -> None:
    start = StartSnapshot(free=70 * GIB, total=80 * GIB, allocated=0)
    b = kv_cache_budget(start, 0.9, weights=16 * GIB, activations=2 * GIB, non_torch=GIB // 2)
    # 72 GiB share - 10 in use at start - 16 weights - 2 activations - 0.5 outside torch.
    assert b.kv_cache == int(43.5 * GIB)
    assert "43.50 GiB KV cache" in b.describe() and "16.00 GiB weights" in b.describe()
    with pytest.raises(ValueError, match="no GPU memory left for the KV cache"):
        kv_cache_budget(start, 0.3, weights=16 * GIB, activations=2 * GIB, non_torch=0)


def test_profile_measures_weights_activations_and_non_torch() -> None:
    mem = FakeMemory(total=80 * GIB, free=79 * GIB, activations=3 * GIB, non_torch=GIB)
    start = StartSnapshot.take(mem)
    mem.load(10 * GIB)
    b = profile_kv_budget(mem, start, 0.5, mem.forward)
    assert mem.profiled == 1
    assert (b.in_use_at_start, b.weights, b.activations, b.non_torch) == (
        GIB,
        10 * GIB,
        3 * GIB,
        GIB,
    )
    assert b.kv_cache == 40 * GIB - GIB - 10 * GIB - 3 * GIB - GIB


def test_engine_sizes_its_kv_cache_from_the_profile(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The whole start-up path on CPU: a stand-in device memory makes the engine
    profile a forward of max_num_batched_tokens and size its block pool from
    what is left; generation then runs on the resized cache."""
    mem = FakeMemory(total=8 * GIB, free=8 * GIB - GIB // 4, activations=GIB // 2)
    monkeypatch.setattr(setup, "device_memory", lambda device: mem)
    real_load = setup.load_model

    def load(*args, **kwargs):
        model = real_load(*args, **kwargs)
        mem.load(GIB)  # the weights, as the device would count them
        return model

    monkeypatch.setattr(setup, "load_model", load)
    profiled: list[tuple[int, int, int]] = []
    real_profile = setup.ModelRunner.profile_run

    def profile_run(self, num_tokens, max_num_seqs, max_model_len):
        real_profile(self, num_tokens, max_num_seqs, max_model_len)  # a real forward
        profiled.append((num_tokens, max_num_seqs, max_model_len))
        mem.forward()

    monkeypatch.setattr(setup.ModelRunner, "profile_run", profile_run)
    with caplog.at_level(logging.INFO, logger="pagedrs.engine.core.setup"):
        llm = LLM(
            str(tiny_model_dir),
            max_model_len=128,
            max_num_batched_tokens=192,
            max_num_seqs=8,
            gpu_memory_utilization=0.25,
        )
    assert profiled == [(192, 8, 128)]
    per_block = llm.kv_cache_stats()["bytes_per_block"]
    kv = int(0.25 * 8 * GIB) - GIB // 4 - GIB - GIB // 2
    assert llm.kv_cache_stats()["num_total_blocks"] == kv // per_block
    assert "gpu_memory_utilization=0.25" in caplog.text and "GiB KV cache" in caplog.text
    out = llm.generate(["Hello there"], SamplingParams(temperature=0.0, max_tokens=4))
    assert len(out[0].outputs[0].token_ids) == 4
    # kv_cache_memory_bytes wins: no profile.
    llm = LLM(str(tiny_model_dir), max_model_len=128, kv_cache_memory_bytes=64 * per_block)
    assert profiled == [(192, 8, 128)]
    assert llm.kv_cache_stats()["num_total_blocks"] == 64


def test_gpu_memory_utilization_is_checked() -> None:
    for bad in (0.0, 1.5, -0.1):
        with pytest.raises(ValueError, match="gpu_memory_utilization must be in"):
            EngineArgs(gpu_memory_utilization=bad)
    assert EngineArgs().gpu_memory_utilization == 0.9
