"""Hypothesis drives the Rust scheduler through its Python API with random
interleavings of add, step, fork, abort, preemption and swap: every step's
arrays are consistent, no block is written by two sequences, and once every
request has finished or been aborted, every block is free again."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from pagedrs._core import Scheduler, StepBatch

ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 2), st.integers(1, 40), st.integers(1, 20)),
        st.tuples(st.just("step"), st.integers(0, 3)),
        st.tuples(st.just("abort"), st.integers(0, 50)),
        st.tuples(st.just("fork"), st.integers(0, 50)),
    ),
    max_size=60,
)


def _check_step(batch: StepBatch, block_size: int, num_blocks: int) -> None:
    qsl = batch.query_start_loc
    assert qsl[0] == 0 and qsl[-1] == len(batch.input_ids)
    (group,) = batch.kv_groups
    slots = group.slot_mapping
    assert len(np.unique(slots)) == len(slots), "two tokens write one slot"
    assert ((slots >= 0) & (slots < num_blocks * block_size)).all()
    for s in range(len(batch.seq_lens)):
        a, b = qsl[s], qsl[s + 1]
        pos = batch.positions[a:b]
        assert pos[-1] == batch.seq_lens[s] - 1
        table = group.block_tables[s]
        np.testing.assert_array_equal(
            slots[a:b], table[pos // block_size] * block_size + pos % block_size
        )


@settings(max_examples=60, deadline=None)
@given(
    ops=ops,
    num_blocks=st.integers(16, 40),
    block_size=st.sampled_from([1, 4, 16]),
    caching=st.booleans(),
    mode=st.sampled_from(["recompute", "swap"]),
)
def test_random_interleavings_free_every_block(ops, num_blocks, block_size, caching, mode):
    sched = Scheduler(
        num_blocks,
        block_size,
        6,
        48,
        min(64, num_blocks * block_size),
        enable_prefix_caching=caching,
        num_cpu_blocks=12,
        preemption_mode=mode,
    )
    live: list[int] = []
    next_id = 0

    def step(token: int) -> None:
        out = sched.schedule()
        if out is None:
            return
        _check_step(out.batch, block_size, num_blocks)
        tokens = np.full(out.batch.num_sampled_tokens, token, dtype=np.int64)
        for f in sched.update(tokens):
            live.remove(f.id)

    for op in ops:
        if op[0] == "add":
            _, prefix, n, max_tokens = op
            prompt = np.array([prefix * 100 + t if t < 20 else next_id + t for t in range(n)])
            try:
                sched.add_request(next_id, prompt, max_tokens, [2])
                live.append(next_id)
            except ValueError:
                assert n >= min(64, num_blocks * block_size)
            next_id += 1
        elif op[0] == "step":
            step(op[1])
        elif op[0] == "abort" and live:
            rid = live[op[1] % len(live)]
            assert sched.abort(rid) is not None
            live.remove(rid)
        elif op[0] == "fork" and live:
            try:
                sched.fork(live[op[1] % len(live)], next_id)
                live.append(next_id)
            except ValueError:
                pass  # parent not running
            next_id += 1
    for _ in range(3000):
        if not sched.has_unfinished_requests():
            break
        step(3)
    stats = sched.stats()
    assert not live and not sched.has_unfinished_requests()
    assert stats.num_free_blocks == stats.num_total_blocks
    assert stats.num_free_cpu_blocks == stats.num_cpu_blocks
