"""Greedy outputs with speculative decoding equal those without it on every
request (token ids, logprobs, finish reasons): drafts of every length 0..K,
steps without drafts between accepting ones, prefix-cache hits and misses,
chunked prefill, swap and recompute preemption, n > 1 (speculation off for
it), and max_model_len reached within a run (structured outputs:
``test_grammar_drafts.py``)."""

from __future__ import annotations

from typing import Any

import pytest
from pagedrs import LLM, SamplingParams
from spec_engines import MAX_MODEL_LEN, NGRAM, PROMPTS, DraftLog, engine, spec_stats

GREEDY = SamplingParams(max_tokens=32, temperature=0.0, logprobs=2)


def _result(outs: list[Any]) -> list[tuple[Any, ...]]:
    """Per request and sequence: token ids, finish reason, logprob entries."""
    return [
        (
            i,
            c.index,
            list(c.token_ids),
            c.finish_reason,
            c.stop_reason,
            c.text,
            None
            if c.logprobs is None
            else [{t: (lp.logprob, lp.rank) for t, lp in pos.items()} for pos in c.logprobs],
            c.cumulative_logprob,
        )
        for i, o in enumerate(outs)
        for c in o.outputs
    ]


@pytest.fixture(scope="module")
def reference(off: LLM) -> list[tuple[Any, ...]]:
    return _result(off.generate(PROMPTS, GREEDY, use_tqdm=False))


@pytest.mark.parametrize("method", ["ngram", "suffix"])
def test_greedy_equal_on_every_request(
    method: str, request: pytest.FixtureRequest, reference: list[tuple[Any, ...]]
) -> None:
    llm: LLM = request.getfixturevalue(method)
    k = llm.llm_engine.engine_core.scheduler.speculative_config()["num_speculative_tokens"]
    log = DraftLog(llm)
    before = spec_stats(llm)
    outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert _result(outs) == reference
    after = spec_stats(llm)
    accepted = after["spec_decode_num_accepted_tokens"] - before["spec_decode_num_accepted_tokens"]
    assert accepted > 0
    assert sum(o.metrics.spec_num_accepted_tokens for o in outs) == accepted
    # The prompt that reaches max_model_len ends there.
    last = outs[-1]
    assert last.outputs[0].finish_reason == "length"
    assert len(last.prompt_token_ids) + len(last.outputs[0].token_ids) == MAX_MODEL_LEN
    # Drafts of many lengths, and steps without drafts between drafted ones.
    seqs = log.per_sequence()
    lengths = {d for counts in seqs.values() for d in counts}
    assert {0, 1, k} <= lengths, lengths
    gaps = [
        counts
        for counts in seqs.values()
        if any(
            counts[i] > 0 and counts[i + 1] == 0 and any(counts[i + 2 :])
            for i in range(len(counts) - 2)
        )
    ]
    assert gaps


def test_prefix_cache_hits_and_misses(ngram: LLM, reference: list[tuple[Any, ...]]) -> None:
    """The same prompts again: their prefixes hit the cache (filled by
    verified tokens only), and the outputs are unchanged."""
    hits = ngram.llm_engine.kv_cache_stats()["prefix_cache_hits"]
    outs = ngram.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert ngram.llm_engine.kv_cache_stats()["prefix_cache_hits"] > hits
    assert _result(outs) == reference
    fresh = ngram.generate(["Unseen: " + p for p in PROMPTS[:3]], GREEDY, use_tqdm=False)
    assert all(o.outputs[0].token_ids for o in fresh)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_chunked_prefill_and_preemption(mode: str, reference: list[tuple[Any, ...]]) -> None:
    """A token budget of 32 (prompts prefilled in chunks, drafts counted in it)
    and a KV cache of 14 blocks for 8 sequences of up to 10 blocks: sequences
    are preempted (swapped or recomputed) with drafts in flight."""
    llm = engine(
        NGRAM,
        num_gpu_blocks_override=14,
        max_num_batched_tokens=32,
        preemption_mode=mode,
        swap_space=0.05,
    )
    try:
        outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
        stats = llm.llm_engine.kv_cache_stats()
        assert _result(outs) == reference
        assert stats["num_preemptions"] > 0
        if mode == "swap":
            assert stats["num_swapped_out"] > 0
        assert stats["spec_decode_num_accepted_tokens"] > 0
        assert stats["num_used_blocks"] == 0
    finally:
        llm.llm_engine.shutdown()


def test_n_greater_than_one_runs_without_speculation(ngram: LLM, off: LLM) -> None:
    """n = 2 beside speculating requests: its sequences never get drafts, and
    every output equals the engine's without speculation."""
    params = [SamplingParams(max_tokens=24, temperature=0.0, n=2)] + [GREEDY] * 3
    prompts = [PROMPTS[0], PROMPTS[0], PROMPTS[1], PROMPTS[2]]
    log = DraftLog(ngram)
    got = ngram.generate(prompts, params, use_tqdm=False)
    want = off.generate(prompts, params, use_tqdm=False)
    assert _result(got) == _result(want)
    assert got[0].metrics.spec_num_draft_tokens == 0
    assert sum(o.metrics.spec_num_accepted_tokens for o in got[1:]) > 0
    first_ids = {sid for step in log.steps for sid, d in step.items() if d}
    assert first_ids  # the others speculated in the same steps
