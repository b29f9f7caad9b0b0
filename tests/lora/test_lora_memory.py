"""The memory LoRA adapters may take is set aside from the KV cache budget
before the pool is sized, and reported beside the KV and weight bytes
(``kv_cache_stats``, ``/metrics``, the start-up log): adapters of the
largest rank on every projection, as many as ``max_cpu_loras`` loaded and
``max_loras`` in slots, take exactly that much and no more."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from lora_models import ADAPTERS, build_base, make_adapter
from pagedrs import LLM, LoRARequest, SamplingParams
from pagedrs.entrypoints.openai.metrics import EngineStatsCollector
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

BUDGET = 8 << 20
GREEDY = SamplingParams(max_tokens=2, temperature=0.0)
#: The tiny llama (lora_models): hidden 64, intermediate 128, 4 heads and 2 KV
#: heads of 16: per layer q 64+64, k 64+32, v 64+32, o 64+64, gate and up
#: 64+128 each, down 128+64 values per unit of rank; 2 layers.
FLOATS_PER_RANK = 2 * (128 + 96 + 96 + 128 + 192 + 192 + 192)


class _Stats:
    def __init__(self, stats: dict) -> None:
        self.stats = stats

    def kv_cache_stats(self) -> dict:
        return self.stats


def _metrics(stats: dict) -> dict[str, float]:
    registry = CollectorRegistry()
    registry.register(EngineStatsCollector(_Stats(stats), "m"))  # type: ignore[arg-type]
    text = generate_latest(registry).decode()
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


def test_adapters_are_drawn_from_the_kv_budget(
    tmp_path: Path, default_model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    base = build_base("llama", tmp_path / "base", default_model_dir)
    plain = LLM(str(base), max_model_len=128, kv_cache_memory_bytes=BUDGET)
    per_block = plain.kv_cache_stats()["bytes_per_block"]
    assert plain.kv_cache_stats()["num_total_blocks"] == BUDGET // per_block
    assert "lora_reserved_bytes" not in plain.kv_cache_stats()
    with caplog.at_level(logging.INFO, logger="pagedrs.engine.core.setup"):
        llm = LLM(
            str(base),
            enable_lora=True,
            max_loras=2,
            max_cpu_loras=3,
            max_lora_rank=16,
            max_model_len=128,
            kv_cache_memory_bytes=BUDGET,
        )
    reserved = 4 * 16 * (3 + 2) * FLOATS_PER_RANK
    stats = llm.kv_cache_stats()
    assert stats["lora_reserved_bytes"] == reserved
    assert stats["num_total_blocks"] == (BUDGET - reserved) // per_block
    assert stats["kv_cache_total_bytes"] + reserved <= BUDGET
    assert f"LoRA adapters up to {reserved} bytes" in caplog.text
    # Four adapters of rank 16 on every projection: three stay loaded, two in slots.
    full = ADAPTERS["all-r16"]
    loras = [
        LoRARequest(f"a{i}", i + 1, str(make_adapter(base, tmp_path / f"a{i}", i, **full)))
        for i in range(4)
    ]
    llm.generate(["Hi", "Hi"], GREEDY, use_tqdm=False, lora_request=loras[:2])
    llm.generate(["Hi", "Hi"], GREEDY, use_tqdm=False, lora_request=loras[2:])
    stats = llm.kv_cache_stats()
    assert stats["num_loaded_loras"] == 3
    assert stats["lora_bytes"] == 3 * 4 * 16 * FLOATS_PER_RANK
    assert stats["lora_slot_bytes"] == 2 * 4 * 16 * FLOATS_PER_RANK
    assert stats["lora_bytes"] + stats["lora_slot_bytes"] == reserved, "the bound, reached"
    metrics = _metrics(stats)
    assert metrics["pagedrs:lora_reserved_bytes"] == reserved
    assert metrics["pagedrs:lora_bytes"] == reserved


def test_a_budget_the_adapters_fill_is_refused_naming_the_fields(
    tmp_path: Path, default_model_dir: Path
) -> None:
    base = build_base("llama", tmp_path / "base", default_model_dir)
    reserved = 4 * 16 * (1 + 1) * FLOATS_PER_RANK
    with pytest.raises(ValueError, match=r"max_cpu_loras=1 loaded \+ max_loras=1 .*kv_cache_mem"):
        LLM(
            str(base),
            enable_lora=True,
            max_lora_rank=16,
            max_model_len=128,
            kv_cache_memory_bytes=reserved + 100,
        )
