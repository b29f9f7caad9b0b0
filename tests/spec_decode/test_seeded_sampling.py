"""Seeded sampling gives the same tokens with speculation on and off: each
verified position draws the engine's seeded noise of (seed, child, position),
so the target's own sample decides; with penalties (over the accepted drafts),
min_tokens, top-k / top-p / min-p and logprobs."""

from __future__ import annotations

from pagedrs import LLM, SamplingParams
from spec_engines import PROMPTS


def _tokens(llm: LLM, params: list[SamplingParams]) -> list[tuple[list[int], object]]:
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    return [
        (
            list(o.outputs[0].token_ids),
            None
            if o.outputs[0].logprobs is None
            else [{t: lp.logprob for t, lp in pos.items()} for pos in o.outputs[0].logprobs],
        )
        for o in outs
    ]


def test_seeded_sampling_equal_on_and_off(off: LLM, ngram: LLM, suffix: LLM) -> None:
    params = [
        SamplingParams(max_tokens=24, temperature=0.7, seed=11 + i, top_p=0.95)
        for i in range(len(PROMPTS))
    ]
    params[1] = SamplingParams(max_tokens=24, temperature=1.0, seed=5, logprobs=3, top_k=40)
    params[2] = SamplingParams(
        max_tokens=24, temperature=0.8, seed=9, repetition_penalty=1.3, frequency_penalty=0.2
    )
    params[3] = SamplingParams(max_tokens=24, temperature=0.9, seed=3, min_tokens=12, min_p=0.05)
    params[4] = SamplingParams(max_tokens=24, temperature=0.0, presence_penalty=0.5)
    want = _tokens(off, params)
    before = ngram.llm_engine.kv_cache_stats()["spec_decode_num_accepted_tokens"]
    assert _tokens(ngram, params) == want
    assert ngram.llm_engine.kv_cache_stats()["spec_decode_num_accepted_tokens"] > before
    assert _tokens(suffix, params) == want
