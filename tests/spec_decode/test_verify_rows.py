"""The verify step's rows and acceptance rule, without a model: position j of
a drafted row is sampled exactly as a row without drafts whose sequence holds
the first j drafts (same seeded noise, min_tokens by position, penalties over
the drafts before it), and drafts are accepted while equal to those samples."""

from __future__ import annotations

import numpy as np
import torch
from pagedrs._core import KVCacheGroupBatch, StepBatch
from pagedrs.executor.sampler import Sampler
from pagedrs.spec_decode.verify import VerifyPlan

VOCAB = 64


def _batch(
    drafts: list[list[int]], num_samples: list[int], seeds: list[int], temps: list[float]
) -> StepBatch:
    """A decode step of ``len(drafts)`` rows, row r with ``drafts[r]``."""
    lens = [1 + len(d) for d in drafts]
    t = sum(lens)
    qsl = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    last = (qsl[1:] - 1).astype(np.int64)
    spec = np.concatenate([np.arange(qsl[r], qsl[r + 1]) for r in range(len(drafts))])
    r = len(drafts)
    return StepBatch(
        input_ids=np.zeros(t, np.int64),
        positions=np.arange(t, dtype=np.int64),
        query_start_loc=qsl,
        seq_lens=np.array(lens, np.int32) + 10,
        seq_request_ids=np.arange(r, dtype=np.uint64),
        kv_groups=[KVCacheGroupBatch(np.arange(t, dtype=np.int64), np.zeros((r, 4), np.int32))],
        logits_indices=last,
        sample_request_ids=np.arange(r, dtype=np.uint64),
        temperature=np.array(temps, np.float32),
        top_p=np.full(r, 0.9, np.float32),
        top_k=np.full(r, -1, np.int32),
        seed=np.array(seeds, np.int64),
        num_output_tokens=np.full(r, 7, np.int64),
        num_samples=np.array(num_samples, np.int32),
        num_draft_tokens=np.array([len(d) for d in drafts], np.int32),
        draft_token_ids=np.array([x for d in drafts for x in d], np.int64),
        spec_logits_indices=spec.astype(np.int64),
    )


def test_position_rows_sample_as_steps_without_drafts() -> None:
    torch.manual_seed(0)
    drafts = [[5, 6, 7], [], [9]]
    batch = _batch(drafts, [1, 2, 1], [3, 4, 5], [0.8, 0.8, 0.0])
    plan = VerifyPlan.from_batch(batch)
    assert plan.rows.num_output_tokens.tolist() == [7, 8, 9, 10, 7, 7, 8]
    assert plan.rows.num_samples.tolist() == [1, 1, 1, 1, 2, 1, 1]
    assert plan.pending == [[], [5], [5, 6], [5, 6, 7], [], [], [9]]
    assert plan.last_row.tolist() == [3, 4, 6]
    logits = torch.randn(7, VOCAB) * 3
    out = Sampler(0)(logits, plan.rows)
    # Each position row alone, as a one-row step with its output count.
    for i in (0, 1, 2, 3, 5, 6):
        r = int(np.searchsorted(plan.last_row, i))
        alone = _batch([[]], [1], [int(batch.seed[r])], [float(batch.temperature[r])])
        alone_rows = VerifyPlan.from_batch(alone).rows
        alone_rows.num_output_tokens[:] = plan.rows.num_output_tokens[i]
        k = int(plan.rows.num_samples[:i].sum())
        assert Sampler(0)(logits[i : i + 1], alone_rows).token_ids[0] == out.token_ids[k]


def test_accepts_while_equal_and_builds_update_tokens() -> None:
    batch = _batch([[5, 6, 7], [], [9, 9]], [1, 2, 1], [-1, -1, -1], [0.0, 0.0, 0.0])
    plan = VerifyPlan.from_batch(batch)
    # Samples: row 0 positions (5, 6, 1, 2): 2 accepted, then 1; row 1 two
    # samples (3, 4); row 2 positions (8, 9, 9): none accepted, then 8.
    tokens = np.array([5, 6, 1, 2, 3, 4, 8, 9, 9], np.int64)
    v = plan.verify(tokens)
    assert v.num_accepted.tolist() == [2, 0, 0]
    assert list(v.run(0)) == [0, 1, 2]
    own = v.own_tokens(batch.num_samples)
    assert own.tolist() == [1, 3, 4, 8]
    assert v.update_tokens(own, batch.num_samples).tolist() == [5, 6, 1, 3, 4, 8]
