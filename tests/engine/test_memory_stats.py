"""``kv_cache_stats()``, ``/metrics`` and the start-up log report the weights'
bytes (quantized weights as held), the KV cache's bytes and the KV budget
left, checked against the engine's actual tensors."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from pagedrs import LLM, SamplingParams
from pagedrs.executor.quant.modules import QuantizedEmbedding, QuantizedLinearModule

BUDGET = {"max_model_len": 128, "kv_cache_memory_bytes": 8 << 20}


class _Stats:
    def __init__(self, stats: dict[str, Any]) -> None:
        self.stats = stats

    def kv_cache_stats(self) -> dict[str, Any]:
        return self.stats


def _float_bytes(model: torch.nn.Module) -> int:
    """The float parameters' and buffers' bytes, each tensor once."""
    seen: dict[int, int] = {}
    for t in [*model.parameters(), *model.buffers()]:
        seen[id(t)] = t.numel() * t.element_size()
    return sum(seen.values())


def _kv_bytes(llm: LLM) -> int:
    runner = llm.llm_engine.engine_core.runner
    return sum(k.nbytes + v.nbytes for k, v in runner.kv_caches)


def _metrics(stats: dict[str, Any]) -> dict[str, float]:
    """The ``/metrics`` samples the engine stats collector gives for ``stats``."""
    from pagedrs.entrypoints.openai.metrics import EngineStatsCollector
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    registry = CollectorRegistry()
    registry.register(EngineStatsCollector(_Stats(stats), "m"))  # type: ignore[arg-type]
    text = generate_latest(registry).decode()
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


def _check_kv(llm: LLM, stats: dict[str, Any]) -> None:
    kv = _kv_bytes(llm)
    assert stats["kv_cache_total_bytes"] == kv
    assert stats["kv_cache_free_bytes"] + stats["kv_cache_used_bytes"] == kv
    per_block = kv // stats["num_total_blocks"]
    assert stats["kv_cache_free_bytes"] == per_block * stats["num_free_blocks"]


def test_float_model_weight_and_kv_bytes(
    tiny_model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="pagedrs.engine.core.setup"):
        llm = LLM(str(tiny_model_dir), **BUDGET)
    try:
        model = llm.llm_engine.engine_core.model
        want = _float_bytes(model)
        stats = llm.kv_cache_stats()
        assert stats["weight_bytes"] == want
        _check_kv(llm, stats)
        assert stats["kv_cache_free_bytes"] == stats["kv_cache_total_bytes"]
        metrics = _metrics(stats)
        assert metrics["pagedrs:weight_bytes"] == want
        assert metrics["pagedrs:kv_cache_free_bytes"] == stats["kv_cache_free_bytes"]
        assert metrics["pagedrs:kv_cache_total_bytes"] == _kv_bytes(llm)
        log = caplog.text
        assert f"Memory: weights {want} bytes" in log
        assert f"KV cache {stats['kv_cache_total_bytes']} bytes" in log
    finally:
        llm.llm_engine.shutdown()


def test_kv_budget_left_while_a_request_runs(tiny_model_dir: Path) -> None:
    llm = LLM(str(tiny_model_dir), **BUDGET, enable_prefix_caching=False)
    try:
        engine = llm.llm_engine
        engine.add_request("r", "Hello there, how are you today?", SamplingParams(max_tokens=4))
        engine.step()
        stats = llm.kv_cache_stats()
        assert stats["num_used_blocks"] > 0
        assert stats["kv_cache_used_bytes"] > 0
        _check_kv(llm, stats)
        while engine.has_unfinished_requests():
            engine.step()
        stats = llm.kv_cache_stats()
        assert stats["kv_cache_free_bytes"] == stats["kv_cache_total_bytes"]
    finally:
        llm.llm_engine.shutdown()


def test_quantized_weights_count_as_stored(smol_gguf: Path) -> None:
    llm = LLM(str(smol_gguf), **BUDGET)
    try:
        model = llm.llm_engine.engine_core.model
        quantized: dict[int, tuple[int, int]] = {}
        for m in model.modules():
            if isinstance(m, (QuantizedLinearModule, QuantizedEmbedding)):
                w = m.qweight  # the tied LM head shares the embedding's
                scales = 0 if w.scales is None else w.scales.nbytes
                quantized[id(w)] = (w.data.nbytes + scales, w.shape[0] * w.shape[1])
        held = sum(b for b, _ in quantized.values())
        want = _float_bytes(model) + held
        stats = llm.kv_cache_stats()
        assert stats["weight_bytes"] == want
        # Q4_1 (Q6_K / Q8_0 for a few tensors): 0.6-1.1 bytes per value, not 4.
        values = sum(n for _, n in quantized.values())
        assert held < 0.3 * 4 * values and want < smol_gguf.stat().st_size
        _check_kv(llm, stats)
    finally:
        llm.llm_engine.shutdown()
