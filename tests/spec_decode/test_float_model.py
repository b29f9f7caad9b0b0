"""A float32 model with speculative decoding: its projections run the
batch-invariant dense kernel (``EngineArgs.projections_batch_invariant``), so
greedy outputs equal those of the same model without speculation on
``batch_invariant=True``, token for token with their logprobs."""

from __future__ import annotations

from typing import Any

from pagedrs import LLM, EngineArgs, SamplingParams
from spec_engines import NGRAM, PROMPTS
from test_greedy_identity import _result


def _float_engine(**kwargs: Any) -> LLM:
    return LLM(
        dtype="float32",
        kv_cache_memory_bytes=64 << 20,
        max_model_len=160,
        seed=0,
        **kwargs,
    )


def test_speculation_turns_batch_invariance_on() -> None:
    assert EngineArgs(dtype="float32", speculative_config=NGRAM).projections_batch_invariant()
    assert not EngineArgs(dtype="float32").projections_batch_invariant()
    assert EngineArgs(dtype="float32", batch_invariant=True).projections_batch_invariant()


def test_float32_greedy_equal_with_and_without_speculation() -> None:
    params = SamplingParams(max_tokens=24, temperature=0.0, logprobs=2)
    prompts = PROMPTS[:3]
    off = _float_engine(batch_invariant=True)
    try:
        reference = _result(off.generate(prompts, params, use_tqdm=False))
    finally:
        off.llm_engine.shutdown()
    on = _float_engine(speculative_config=NGRAM)
    try:
        outs = on.generate(prompts, params, use_tqdm=False)
        accepted = sum(o.metrics.spec_num_accepted_tokens for o in outs)
    finally:
        on.llm_engine.shutdown()
    assert _result(outs) == reference
    assert accepted > 0
