"""``kv_cache_dtype`` through the engine: blocks from the budget, statistics
and metrics count the real bytes (int8 scales included); quantized blocks
survive swaps, recompute and prefix-cache hits (the outputs of an
unpreempted run, over float32 weights); and the default model's
teacher-forced logprobs stay within the bounds measured by
``benches/bench_kv_quality.py``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pagedrs import LLM, SamplingParams
from reference import PROMPTS

GREEDY = SamplingParams(max_tokens=40, temperature=0.0)

#: A fixed text for teacher forcing (prose, ~170 tokens).
TEXT = (
    "The river rose slowly through the night, and by morning the low fields beside the "
    "village were under a sheet of brown water. Farmers walked along the raised road, "
    "counting the fences that still showed above the surface and talking about the last "
    "great flood, forty years before, when the old mill had been carried away. Children "
    "floated paper boats from the bridge while their parents carried sacks of grain to the "
    "upper rooms of the houses. By noon the rain had stopped, the clouds broke apart, and "
    "the sun lit the water so brightly that the whole valley looked like a mirror. In the "
    "evening the mayor rang the church bell to call everyone to the square, where bread, "
    "soup and dry blankets were shared among the families whose homes had been flooded."
)

#: Bounds on mean / max |logprob - float32 KV's| over TEXT's 147 predicted
#: tokens (float32 weights, default model). Measured on this machine (mean,
#: max): bfloat16 0.0041, 0.022; fp8_e4m3 0.069, 0.30; fp8_e5m2 0.153, 0.77;
#: int8 0.025, 0.166 (benches/bench_kv_quality.py over 3,790 positions of 16
#: ShareGPT-like replies: 0.0043, 0.0677, 0.138, 0.0242). Bounds: about 1.6x
#: the means and 2x the maxima.
DLOGPROB_BOUNDS = {
    "bfloat16": (0.0065, 0.045),
    "fp8_e4m3": (0.11, 0.6),
    "fp8_e5m2": (0.25, 1.5),
    "int8": (0.04, 0.33),
}


class _Stats:
    """An engine whose ``kv_cache_stats()`` are fixed (what the collector reads)."""

    def __init__(self, stats: dict[str, Any]) -> None:
        self.stats = stats

    def kv_cache_stats(self) -> dict[str, Any]:
        return self.stats


def _tokens(outs: list[Any]) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in outs]


@pytest.mark.parametrize("kv", ["int8", "fp8_e4m3"])
@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption_and_prefix_hits_keep_the_outputs(
    tiny_model_dir: Path, kv: str, mode: str
) -> None:
    common = {"kv_cache_dtype": kv, "block_size": 8, "max_model_len": 128}
    want = _tokens(
        LLM(str(tiny_model_dir), enable_prefix_caching=False, **common).generate(
            PROMPTS, GREEDY, use_tqdm=False
        )
    )
    llm = LLM(
        str(tiny_model_dir),
        num_gpu_blocks_override=16,
        preemption_mode=mode,
        swap_space=0.01,
        **common,
    )
    assert _tokens(llm.generate(PROMPTS, GREEDY, use_tqdm=False)) == want
    assert _tokens(llm.generate(PROMPTS, GREEDY, use_tqdm=False)) == want  # prefix hits
    stats = llm.kv_cache_stats()
    assert stats["num_preemptions"] > 0 and stats["prefix_cache_hits"] > 0
    if mode == "swap":
        assert stats["num_swapped_in"] == stats["num_swapped_out"] > 0
    assert stats["num_free_blocks"] == stats["num_total_blocks"]


def test_bfloat16_weights_int8_kv_swaps_keep_the_outputs(tiny_model_dir: Path) -> None:
    common = {"dtype": "bfloat16", "kv_cache_dtype": "int8", "block_size": 8}
    want = _tokens(
        LLM(str(tiny_model_dir), max_model_len=128, **common).generate(
            PROMPTS, GREEDY, use_tqdm=False
        )
    )
    llm = LLM(
        str(tiny_model_dir),
        max_model_len=128,
        num_gpu_blocks_override=16,
        preemption_mode="swap",
        swap_space=0.01,
        **common,
    )
    assert llm.llm_engine.engine_core.runner.attention.name == "cpu"
    assert _tokens(llm.generate(PROMPTS, GREEDY, use_tqdm=False)) == want
    assert llm.kv_cache_stats()["num_swapped_out"] > 0


def _teacher_forced(llm: LLM, ids: list[int]) -> list[float]:
    out = llm.generate(
        [{"prompt_token_ids": ids}], SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False
    )[0]
    plp = out.prompt_logprobs
    assert plp is not None
    return [plp[i][ids[i]].logprob for i in range(1, len(ids))]  # type: ignore[index]


def test_default_model_capacity_stats_and_logprob_bounds(default_model_dir: Path) -> None:
    from pagedrs.entrypoints.openai.metrics import EngineStatsCollector
    from prometheus_client import CollectorRegistry, generate_latest

    budget = {"max_model_len": 512, "kv_cache_memory_bytes": 64 << 20}
    base = LLM(str(default_model_dir), kv_cache_dtype="float32", **budget)
    ids = base.get_tokenizer()(TEXT).input_ids
    want = _teacher_forced(base, ids)
    base_blocks = base.kv_cache_stats()["num_total_blocks"]
    base.llm_engine.shutdown()
    for kv, (mean_bound, max_bound) in DLOGPROB_BOUNDS.items():
        llm = LLM(str(default_model_dir), kv_cache_dtype=kv, **budget)
        got = _teacher_forced(llm, ids)
        diffs = [abs(a - b) for a, b in zip(got, want, strict=True)]
        mean = sum(diffs) / len(diffs)
        assert mean < mean_bound and max(diffs) < max_bound, (kv, mean, max(diffs))
        stats = llm.kv_cache_stats()
        spec = llm.llm_engine.engine_core.kv_spec
        assert stats["kv_cache_dtype"] == kv and stats["bytes_per_block"] == spec.bytes_per_block
        assert stats["num_total_blocks"] == (64 << 20) // spec.bytes_per_block
        if kv == "int8":
            assert stats["num_total_blocks"] / base_blocks >= 3.8
            registry = CollectorRegistry()
            registry.register(EngineStatsCollector(_Stats(stats), "m"))  # type: ignore[arg-type]
            text = generate_latest(registry).decode()
            per_block = f'pagedrs:kv_cache_bytes_per_block{{model_name="m"}} {spec.bytes_per_block}'
            assert per_block in text and 'kv_cache_dtype="int8"' in text
        llm.llm_engine.shutdown()
