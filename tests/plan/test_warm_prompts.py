"""A simulation that starts from a server's warm prefix cache
(``simulate(..., warm_prompts=...)``): the warm prompts are computed
before the trace, untimed and uncounted, and the trace's requests hit them."""

from __future__ import annotations

import numpy as np
import pytest
from pagedrs.plan import (
    PlanConfig,
    StepShape,
    StepTimeModel,
    load_profile,
    resolve_model_shape,
    simulate,
)
from pagedrs.plan.trace import Trace, TraceRequest

CFG = PlanConfig(
    dtype="float32", num_gpu_blocks=256, max_model_len=2048, block_size=16,
    max_num_seqs=8, max_num_batched_tokens=2048, enable_prefix_caching=True,
)  # fmt: skip


def _model() -> StepTimeModel:
    return StepTimeModel(resolve_model_shape("smollm2-135m"), load_profile("cpu"), dtype="float32")


def test_warm_prefix_is_hit_and_not_counted() -> None:
    """A 160-token prompt after a warm 96-token prefix of it: 6 full blocks
    hit, so its first step computes 64 tokens at a context of 160; the warm
    prompts add no step, time, query or hit to the result."""
    sm = _model()
    prompt = np.arange(100, 260, dtype=np.int64)
    trace = Trace("t", [TraceRequest(prompt, 4, 0.0)], True)
    other = np.arange(5000, 5040, dtype=np.int64)
    cold = simulate(trace, CFG, sm)
    warm = simulate(trace, CFG, sm, warm_prompts=[prompt[:96].copy(), other])
    assert (cold.prefix_cache_queries, cold.prefix_cache_hits) == (160, 0)
    assert (warm.prefix_cache_queries, warm.prefix_cache_hits) == (160, 96)
    assert warm.num_steps == cold.num_steps == 4
    first = StepShape.from_lengths([64], [160], sampled=1)
    assert warm.first_token[0] - warm.arrival[0] == pytest.approx(sm(first))
    assert cold.first_token[0] == pytest.approx(sm(StepShape.from_lengths([160], [160], 1)))


def test_no_warm_prompts_is_a_cold_start() -> None:
    sm = _model()
    trace = Trace("t", [TraceRequest(np.arange(300, 340, dtype=np.int64), 3, 0.5)], True)
    a, b = simulate(trace, CFG, sm), simulate(trace, CFG, sm, warm_prompts=[])
    assert a.first_token[0] == b.first_token[0] and a.finish[0] == b.finish[0]
