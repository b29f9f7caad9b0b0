"""Prefix caching: same outputs on and off, blocks of a shared prefix allocated
once, hits counted in tokens, cache salts separating tenants."""

from __future__ import annotations

from pathlib import Path

import pytest
from pagedrs import LLM, LLMEngine, SamplingParams
from pagedrs.engine.arg_utils import EngineArgs
from reference import PROMPTS

GREEDY = SamplingParams(max_tokens=24, temperature=0.0)


def _ids(outs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outs]


def _run(llm: LLM, prompts) -> list[list[int]]:
    return _ids(llm.generate(prompts, GREEDY, use_tqdm=False))


@pytest.mark.parametrize("block_size", [8, 16])
def test_outputs_equal_with_caching_on_and_off(tiny_model_dir: Path, block_size: int) -> None:
    tok_prompts: list = [{"prompt_token_ids": list(range(300, 300 + n))} for n in (16, 32, 17)]
    prompts = PROMPTS[:4] + tok_prompts  # lengths include exact multiples of the block size
    # Batch-invariant: cache hits change how many rows each step computes.
    kw = {"block_size": block_size, "batch_invariant": True}
    off = LLM(str(tiny_model_dir), enable_prefix_caching=False, **kw)
    on = LLM(str(tiny_model_dir), enable_prefix_caching=True, **kw)
    want = _run(off, prompts)
    # The same prompts several times in a row: later runs hit the cache.
    for _ in range(3):
        assert _run(on, prompts) == want
    # The same prompt several times inside one batch.
    assert _run(on, [prompts[3]] * 3 + [prompts[5]] * 2) == [want[3]] * 3 + [want[5]] * 2
    stats = on.kv_cache_stats()
    assert stats["prefix_cache_hits"] > 0
    assert stats["num_cached_blocks"] > 0
    assert stats["num_free_blocks"] == stats["num_total_blocks"], "cached blocks stay free"
    assert off.kv_cache_stats()["prefix_cache_queries"] == 0


def test_default_model_with_cache_hits_matches_hf(default_model_dir: Path, default_reference):
    llm = LLM(str(default_model_dir), max_model_len=512)
    params = SamplingParams(max_tokens=32, temperature=0.0)
    first = _ids(llm.generate(PROMPTS, params, use_tqdm=False))
    again = _ids(llm.generate(PROMPTS, params, use_tqdm=False))
    assert first == again == default_reference
    assert llm.kv_cache_stats()["prefix_cache_hits"] > 0


def _engine(model_dir: Path, **kw) -> LLMEngine:
    return LLMEngine(EngineArgs(model=str(model_dir), block_size=16, max_model_len=256, **kw))


def test_shared_prefix_blocks_allocated_once(tiny_model_dir: Path) -> None:
    engine = _engine(tiny_model_dir)
    prefix = list(range(1000, 1064))  # 64 tokens: 4 full blocks
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    engine.add_request("first", [*prefix, 5], params)
    engine.step()  # prefill: the 4 prefix blocks enter the cache
    for r in range(4):
        engine.add_request(f"r{r}", [*prefix, 7 + r, 8, 9], params)
    engine.step()
    stats = engine.kv_cache_stats()
    # 4 shared prefix blocks + 1 tail block for each of the 5 requests.
    assert stats["num_used_blocks"] == 4 + 5
    assert stats["prefix_cache_hits"] == 4 * 64
    while engine.has_unfinished_requests():
        engine.step()
    stats = engine.kv_cache_stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"]


def test_cache_salt_separates_tenants(tiny_model_dir: Path) -> None:
    llm = LLM(str(tiny_model_dir), block_size=16, max_model_len=256)
    ids = list(range(2000, 2040))

    def run(salt: str | None) -> tuple[int, list[int]]:
        before = llm.kv_cache_stats()["prefix_cache_hits"]
        out = llm.generate([{"prompt_token_ids": ids, "cache_salt": salt}], GREEDY)
        return llm.kv_cache_stats()["prefix_cache_hits"] - before, out[0].outputs[0].token_ids

    hits_a, out_a = run("tenant-a")
    assert hits_a == 0
    hits_b, out_b = run("tenant-b")
    assert hits_b == 0, "a different salt never shares a block"
    hits_a2, out_a2 = run("tenant-a")
    assert hits_a2 == 32, "the same salt hits its 2 full blocks"
    assert out_a == out_b == out_a2


def test_num_cached_tokens_counts_the_prefix_hit(tiny_model_dir: Path) -> None:
    """``RequestOutput.num_cached_tokens``: the prompt tokens found cached at
    the request's first step, whole blocks only, generated tokens' blocks
    included (an agent's next turn); 0 without the cache."""
    prefix = list(range(1000, 1060))  # 60 tokens: 3 full blocks of 16 and 12 more
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    for caching in (True, False):
        engine = _engine(tiny_model_dir, enable_prefix_caching=caching)
        engine.add_request("first", prefix, params)
        outs = []
        while engine.has_unfinished_requests():
            outs += engine.step()
        assert outs[0].num_cached_tokens == outs[-1].num_cached_tokens == 0
        generated = outs[-1].outputs[0].token_ids
        # The prefix's 3 blocks hit; the 4th block holds 4 generated tokens.
        engine.add_request("second", [*prefix[:50], *range(3000, 3020)], params)
        engine.add_request("third", [*prefix, *generated[:6], 7, 8], params)
        finals = {}
        while engine.has_unfinished_requests():
            for o in engine.step():
                finals[o.request_id] = o
        assert finals["second"].num_cached_tokens == (48 if caching else 0)
        assert finals["third"].num_cached_tokens == (64 if caching else 0)


def test_first_scheduled_time_orders_queue_and_prefill(tiny_model_dir: Path) -> None:
    """``RequestMetrics.first_scheduled_time`` comes with the first delta, like
    ``num_cached_tokens``: arrival <= first scheduled <= first token; with one
    sequence at a time the second request is first scheduled only after the
    first has finished (its time queued covers the first's whole run)."""
    engine = _engine(tiny_model_dir, max_num_seqs=1)
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    engine.add_request("a", list(range(1000, 1040)), params)
    engine.add_request("b", list(range(2000, 2040)), params)
    finals = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            finals[o.request_id] = o
    a, b = finals["a"].metrics, finals["b"].metrics
    assert a is not None and b is not None
    for m in (a, b):
        assert m.first_scheduled_time is not None and m.first_token_time is not None
        assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time
    assert a.finished_time is not None and b.first_scheduled_time >= a.finished_time
