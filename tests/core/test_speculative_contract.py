"""The speculative decoding side of ``pagedrs._core``'s step contract:
``speculative_config`` validated in Rust with errors naming the field, draft
tokens in the ``StepBatch`` (``num_draft_tokens``, ``draft_token_ids``,
``spec_logits_indices``), ``update(sampled, num_accepted)`` keeping the
accepted drafts and giving rejected slots back, and the counters. A greedy
"target" that repeats a loop stands in for the model: exact acceptance gives
the same tokens as the run without speculation, in fewer steps."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from pagedrs._core import Scheduler, StepBatch, check_speculative_config

LOOP = [5, 6, 7, 8, 9]


def _next(ctx: list[int]) -> int:
    """The "target model": continue the loop 5 6 7 8 9 (9 after anything else)."""
    return LOOP[(LOOP.index(ctx[-1]) + 1) % 5] if ctx[-1] in LOOP else 9


def _sched(spec: dict[str, object] | None) -> Scheduler:
    s = Scheduler(64, 4, 4, 64, 64, speculative_config=spec)
    s.add_request(1, np.array(LOOP * 3, dtype=np.int64), 20, [2])
    return s


def _run(s: Scheduler) -> tuple[list[int], int]:
    """Drive ``s`` to the end accepting what the target gives; returns the
    output and the steps taken."""
    ctx = LOOP * 3
    steps = 0
    while (out := s.schedule()) is not None:
        steps += 1
        b = out.batch
        sampled: list[int] = []
        accepted: list[int] = []
        at = 0
        for r in range(len(b.sample_request_ids)):
            drafts = b.draft_token_ids[at : at + b.num_draft_tokens[r]].tolist()
            at += len(drafts)
            rows = b.spec_logits_indices
            assert rows.shape == (b.num_sampled_tokens + b.num_drafts,)
            a = 0
            while a < len(drafts) and _next(ctx + drafts[:a]) == drafts[a]:
                a += 1
            sampled += drafts[:a] + [_next(ctx + drafts[:a])]
            accepted.append(a)
        finished = s.update(np.array(sampled, dtype=np.int64), np.array(accepted, dtype=np.int64))
        ctx += sampled
        if finished:
            assert ctx[15:] == finished[0].output_token_ids.tolist()
            return finished[0].output_token_ids.tolist(), steps
    raise AssertionError("the request did not finish")


@pytest.mark.parametrize("method", ["ngram", "suffix"])
def test_exact_acceptance_gives_the_same_tokens_in_fewer_steps(method: str) -> None:
    plain, plain_steps = _run(_sched(None))
    s = _sched({"method": method, "num_speculative_tokens": 4})
    fast, fast_steps = _run(s)
    assert fast == plain and len(plain) == 20
    assert fast_steps < plain_steps
    st = s.stats()
    assert st.spec_decode_num_accepted_tokens > 0
    assert st.spec_decode_num_accepted_tokens <= st.spec_decode_num_draft_tokens
    assert sum(st.spec_decode_num_accepted_tokens_per_pos) == st.spec_decode_num_accepted_tokens
    assert st.num_free_blocks == st.num_total_blocks


def test_draft_rows_and_rejection() -> None:
    s = _sched({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2})
    out = s.schedule()
    assert out is not None and out.batch.num_drafts == 0  # the prefill
    np.testing.assert_array_equal(out.batch.spec_logits_indices, out.batch.logits_indices)
    s.update(np.array([5], dtype=np.int64))
    out = s.schedule()
    assert out is not None
    b = out.batch
    np.testing.assert_array_equal(b.num_draft_tokens, [3])
    np.testing.assert_array_equal(b.draft_token_ids, [6, 7, 8])
    np.testing.assert_array_equal(b.input_ids, [5, 6, 7, 8])
    np.testing.assert_array_equal(b.positions, [15, 16, 17, 18])
    np.testing.assert_array_equal(b.spec_logits_indices, [0, 1, 2, 3])
    np.testing.assert_array_equal(b.logits_indices, [3])
    back = pickle.loads(pickle.dumps(b))
    assert isinstance(back, StepBatch)
    np.testing.assert_array_equal(back.draft_token_ids, b.draft_token_ids)
    with pytest.raises(ValueError, match="accepted token 9 at draft position 0 is not the draft"):
        s.update(np.array([9, 9], dtype=np.int64), np.array([1], dtype=np.int64))
    with pytest.raises(ValueError, match="accepted 4 draft tokens, but it had 3"):
        s.update(np.array([6, 7, 8, 9, 5], dtype=np.int64), np.array([4], dtype=np.int64))
    used = s.stats().num_used_blocks
    assert s.update(np.array([3], dtype=np.int64), np.array([0], dtype=np.int64)) == []
    # Positions 16..18 held rejected drafts only: their block went back.
    assert s.stats().num_used_blocks == used - 1


def test_speculative_config_errors_name_the_field() -> None:
    full = check_speculative_config({"method": "ngram", "prompt_lookup_max": 3})
    assert full["prompt_lookup_min"] == 3 and full["num_speculative_tokens"] == 5
    assert check_speculative_config({"method": "suffix"})["num_speculative_tokens"] == 24
    bad = [
        (
            {"method": "eagle"},
            "speculative_config.method must be 'ngram', 'suffix' or 'draft_model', got \"eagle\"",
        ),
        ({}, "speculative_config.method is required"),
        ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens must be >= 1"),
        (
            {"method": "ngram", "num_speculative_tokens": "4"},
            "num_speculative_tokens must be an integer",
        ),
        (
            {"method": "ngram", "prompt_lookup_min": 4, "prompt_lookup_max": 2},
            "prompt_lookup_min must be <= prompt_lookup_max",
        ),
        (
            {"method": "suffix", "suffix_decoding_min_token_prob": 2.0},
            "suffix_decoding_min_token_prob",
        ),
        ({"method": "ngram", "model": "tiny"}, "speculative_config.model is not supported"),
        ({"method": "ngram", "num_spec_tokens": 3}, 'unknown field "num_spec_tokens"'),
    ]
    for spec, message in bad:
        with pytest.raises(ValueError, match=message):
            check_speculative_config(spec)
        with pytest.raises(ValueError, match=message):
            Scheduler(64, 4, 4, 64, 64, speculative_config=spec)
    s = Scheduler(
        64, 4, 4, 64, 64, speculative_config={"method": "suffix", "num_speculative_tokens": 2}
    )
    cfg = s.speculative_config()
    assert cfg is not None and cfg["method"] == "suffix" and cfg["num_speculative_tokens"] == 2
    assert Scheduler(64, 4, 4, 64, 64).speculative_config() is None
