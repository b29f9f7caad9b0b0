"""Speculative decoding counters on /metrics under vLLM's names
(``vllm:spec_decode_*``) and pagedrs', read from an engine that ran drafts."""

from __future__ import annotations

from typing import Any

from pagedrs import LLM, SamplingParams
from pagedrs.entrypoints.openai.metrics import EngineStatsCollector
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from spec_engines import PROMPTS


class _Engine:
    def __init__(self, llm: LLM) -> None:
        self.llm = llm

    def kv_cache_stats(self) -> dict[str, Any]:
        return self.llm.llm_engine.kv_cache_stats()


def test_spec_decode_counters_under_vllm_names(ngram: LLM) -> None:
    ngram.generate(PROMPTS[:3], SamplingParams(max_tokens=16, temperature=0.0), use_tqdm=False)
    stats = ngram.llm_engine.kv_cache_stats()
    registry = CollectorRegistry()
    registry.register(EngineStatsCollector(_Engine(ngram), "smol"))  # type: ignore[arg-type]
    samples = {
        (s.name, s.labels.get("position")): s.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for s in family.samples
        if s.name.endswith("_total")
    }
    for prefix in ("vllm", "pagedrs"):
        for name in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
            key = (f"{prefix}:spec_decode_{name}_total", None)
            assert samples[key] == stats[f"spec_decode_{name}"], key
        per_pos = stats["spec_decode_num_accepted_tokens_per_pos"]
        assert per_pos and per_pos[0] > 0
        for pos, count in enumerate(per_pos):
            key = (f"{prefix}:spec_decode_num_accepted_tokens_per_pos_total", str(pos))
            assert samples[key] == count
    assert 0 < stats["spec_decode_num_accepted_tokens"] <= stats["spec_decode_num_draft_tokens"]
    assert (
        sum(stats["spec_decode_num_accepted_tokens_per_pos"])
        == stats["spec_decode_num_accepted_tokens"]
    )
