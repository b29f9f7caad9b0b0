"""The typed step contract of ``pagedrs._core``: one step in flight at a time,
requests of that step cannot be ended mid-step, the classes pickle, and the
shared formulas come from Rust."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from pagedrs._core import Scheduler, SchedulerOutput, child_seed


def _sched() -> Scheduler:
    s = Scheduler(16, 4, 4, 64, 64)
    s.add_request(1, np.arange(5, dtype=np.int64), 4, [])
    return s


def test_one_step_in_flight() -> None:
    s = _sched()
    out = s.schedule()
    assert out is not None and out.batch.num_tokens == 5
    with pytest.raises(ValueError, match="step is in flight"):
        s.schedule()
    s.cancel_step()
    out = s.schedule()  # the same step again, nothing was applied
    assert out is not None and out.batch.num_tokens == 5
    s.update(np.full(out.batch.num_sampled_tokens, 7, dtype=np.int64))
    assert s.schedule() is not None


def test_a_scheduled_request_cannot_end_mid_step() -> None:
    s = _sched()
    s.schedule()
    for end in (s.abort, s.stop_request):
        with pytest.raises(ValueError, match="in the step in flight"):
            end(1)
    s.update(np.array([7], dtype=np.int64))
    f = s.abort(1)
    assert f is not None and f.reason == "abort" and list(f.output_token_ids) == [7]
    stats = s.stats()
    assert stats.num_free_blocks == stats.num_total_blocks


def test_pool_larger_than_block_ids_is_refused() -> None:
    with pytest.raises(ValueError, match="num_blocks=.* more blocks than block ids"):
        Scheduler(2**62, 16, 4, 64, 64)


def test_scheduler_output_pickles() -> None:
    out = _sched().schedule()
    assert out is not None
    back = pickle.loads(pickle.dumps(out))
    assert isinstance(back, SchedulerOutput)
    for name in ("input_ids", "positions", "query_start_loc", "seq_lens", "sample_request_ids"):
        np.testing.assert_array_equal(getattr(back.batch, name), getattr(out.batch, name))
    g, h = back.batch.kv_groups[0], out.batch.kv_groups[0]
    np.testing.assert_array_equal(g.block_tables, h.block_tables)
    np.testing.assert_array_equal(g.slot_mapping, h.slot_mapping)
    assert back.block_moves.is_empty and back.batch.num_sampled_tokens == 1


def test_child_seed_is_the_rust_formula() -> None:
    assert child_seed(-1, 3) == -1 and child_seed(5, 0) == 5
    want = ((5 + 2 * 0x9E3779B97F4A7C15) % 2**64) >> 1
    assert child_seed(5, 2) == want
