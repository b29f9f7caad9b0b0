"""The goodput draft-length policy in the engine (``draft_length_policy``,
``draft_step_costs``): with given step costs, a batch whose step is
compute-bound drafts nothing, small batches draft lengths of their own, and
greedy outputs equal those without speculation on every request; without
given costs the engine measures them at start-up (``cost_model``). Timings
decide nothing here: every policy test gives its costs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from pagedrs import LLM, SamplingParams
from pagedrs.spec_decode.cost_model import (
    calibration_batch_sizes,
    measure_draft_step_costs,
    step_cost_point,
    synthetic_step,
)
from spec_engines import NGRAM, PROMPTS, SUFFIX, DraftLog, engine

#: The first two prompts (they quote their input) run on alone once the
#: others end.
PARAMS = [
    SamplingParams(max_tokens=40 if i < 2 else 8, temperature=0.0, logprobs=1)
    for i in range(len(PROMPTS))
]

#: One sequence: 10 ms a step, 0.5 ms a draft (drafts nearly free); four:
#: 40 ms a step, 10 ms a draft, so a draft must gain 4 x 10 / 40 = 1 token
#: (none does): speculation is off at 4 sequences and more.
COSTS = [[1, 0.010, 0.0005], [4, 0.040, 0.010]]


def _goodput(config: dict[str, Any]) -> dict[str, Any]:
    return {**config, "draft_length_policy": "goodput", "draft_step_costs": COSTS}


def _tokens(outs: list[Any]) -> list[tuple[Any, ...]]:
    return [
        (
            list(c.token_ids),
            c.finish_reason,
            c.cumulative_logprob,
            [{t: lp.logprob for t, lp in pos.items()} for pos in c.logprobs or []],
        )
        for o in outs
        for c in o.outputs
    ]


@pytest.fixture(scope="module")
def reference(off: LLM) -> list[tuple[Any, ...]]:
    return _tokens(off.generate(PROMPTS, PARAMS, use_tqdm=False))


@pytest.fixture(scope="module", params=["ngram", "suffix"])
def policy_engine(request: pytest.FixtureRequest) -> Iterator[LLM]:
    llm = engine(_goodput(NGRAM if request.param == "ngram" else SUFFIX))
    yield llm
    llm.llm_engine.shutdown()


def test_greedy_equal_with_the_policy_and_off_at_a_large_batch(
    policy_engine: LLM, reference: list[tuple[Any, ...]]
) -> None:
    """All prompts at once: no drafts while 4 or more sequences sample in a
    step; drafts once fewer remain; outputs equal speculation off."""
    cfg = policy_engine.llm_engine.engine_core.scheduler.speculative_config()
    assert cfg["draft_step_costs"] == [tuple(p) for p in COSTS]
    log = DraftLog(policy_engine)
    outs = policy_engine.generate(PROMPTS, PARAMS, use_tqdm=False)
    assert _tokens(outs) == reference
    large = [s for s in log.steps if len(s) >= 4]
    small = [s for s in log.steps if len(s) < 4]
    assert large and small
    assert all(d == 0 for s in large for d in s.values())
    assert any(d > 0 for s in small for d in s.values())
    assert sum(o.metrics.spec_num_accepted_tokens for o in outs) > 0


def test_greedy_equal_one_request_at_a_time(
    policy_engine: LLM, reference: list[tuple[Any, ...]]
) -> None:
    """Prompts alone (batch 1, drafts nearly free): lengths of the policy's
    choosing, outputs equal speculation off."""
    log = DraftLog(policy_engine)
    outs = [
        policy_engine.generate([p], q, use_tqdm=False)[0]
        for p, q in zip(PROMPTS[:3], PARAMS, strict=False)
    ]
    assert _tokens(outs) == reference[:3]
    k = policy_engine.llm_engine.engine_core.scheduler.speculative_config()[
        "num_speculative_tokens"
    ]
    lengths = {d for s in log.steps for d in s.values()}
    assert 0 in lengths and any(0 < d <= k for d in lengths), lengths


def test_the_engine_measures_the_step_costs_at_start() -> None:
    """Without given costs the goodput policy measures them: one point per
    calibration batch size, decode time and draft share growing with the
    batch."""
    assert calibration_batch_sizes(256) == [1, 4, 16, 64, 256]
    assert calibration_batch_sizes(4) == [1, 4]
    assert calibration_batch_sizes(1) == [1]
    llm = engine({k: v for k, v in NGRAM.items() if k != "draft_length_policy"}, max_num_seqs=4)
    try:
        cfg = llm.llm_engine.engine_core.scheduler.speculative_config()
        points = cfg["draft_step_costs"]
        assert [p[0] for p in points] == [1, 4]
        assert all(d > 0 and x >= 0 for _, d, x in points)
        assert points[1][1] >= points[0][1]
        shares = [b * x / d for b, d, x in points]
        assert all(a <= b + 1e-12 for a, b in zip(shares, shares[1:], strict=False))
        assert shares[-1] <= 1.0 + 1e-12
        # The measuring steps: every token's logits, nothing written.
        b = synthetic_step(3, 2, 20, 16, 1)
        assert (b.num_tokens, b.num_seqs, b.num_drafts) == (9, 3, 6)
        assert b.positions.tolist() == [20, 21, 22] * 3
        assert b.kv_groups[0].slot_mapping.tolist() == [-1] * 9
        assert b.spec_logits_indices.tolist() == list(range(9))
        assert b.logits_indices.tolist() == [2, 5, 8]
        again = measure_draft_step_costs(
            llm.llm_engine.engine_core.runner,
            device=llm.llm_engine.engine_core.runner.device,
            block_size=16,
            num_blocks=4,
            num_groups=1,
            max_num_seqs=2,
            max_num_batched_tokens=4,
            max_model_len=160,
            num_speculative_tokens=4,
        )
        # Batch 2 within a budget of 4 tokens: one draft per sequence.
        assert [p[0] for p in again] == [1, 2]
        with pytest.raises(ValueError, match=r"draft_step_costs cannot be measured"):
            measure_draft_step_costs(
                llm.llm_engine.engine_core.runner,
                device=llm.llm_engine.engine_core.runner.device,
                block_size=16,
                num_blocks=4,
                num_groups=1,
                max_num_seqs=2,
                max_num_batched_tokens=4,
                max_model_len=5,
                num_speculative_tokens=4,
            )
    finally:
        llm.llm_engine.shutdown()


def test_a_point_from_timed_pairs() -> None:
    """The draft share is the median of the pairs' verify / decode ratios
    over the drafts: one pair slowed by another process (both its steps
    alike, or one of them) moves neither the share nor the median decode
    time."""
    # Pairs at 10 ms / 12 ms (ratio 1.2), one slowed 5x alike, one whose
    # verify step alone was slowed: median ratio 1.2, two drafts a sequence.
    b, decode_s, draft_s = step_cost_point(4, 2, [0.010, 0.050, 0.010], [0.012, 0.060, 0.030], None)
    assert (b, decode_s) == (4, 0.010)
    assert draft_s == pytest.approx(0.1 * 0.010 / 4)
    assert 4 * draft_s / decode_s == pytest.approx(0.1)


def test_a_point_keeps_the_previous_share_and_caps_it() -> None:
    """A larger batch's share of a draft is at least the smaller batch's and
    at most 1, and its step no faster."""
    prev = (4, 0.010, 0.1 * 0.010 / 4)  # share 0.1
    # Measured: decode faster than the smaller batch, verify no slower.
    b, decode_s, draft_s = step_cost_point(16, 1, [0.008], [0.008], prev)
    assert decode_s == 0.010
    assert 16 * draft_s / decode_s == pytest.approx(0.1)
    # A verify step 3x the decode step with one draft: share 2, capped at 1.
    _, decode_s, draft_s = step_cost_point(64, 1, [0.100], [0.300], prev)
    assert 64 * draft_s / decode_s == pytest.approx(1.0)
    with pytest.raises(ValueError, match="timed pairs"):
        step_cost_point(1, 1, [0.1], [], None)
