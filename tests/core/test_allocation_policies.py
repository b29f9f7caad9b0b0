"""Allocation policies of the Rust scheduler (paged vs the contiguous-reservation
baselines of the paper's Fig. 2) and its per-step memory breakdown, through the
Python API."""

from __future__ import annotations

import numpy as np
import pytest
from pagedrs._core import Scheduler
from reference import PROMPTS

SHARES = ("token_states", "reservation", "internal", "external", "free")


def _sched(policy: str, slots: int, max_model_len: int, block_size: int = 1) -> Scheduler:
    return Scheduler(
        slots // block_size,
        block_size,
        64,
        4096,
        max_model_len,
        enable_prefix_caching=False,
        allocation_policy=policy,
    )


def _add(s: Scheduler, rid: int, prompt_len: int, max_tokens: int) -> None:
    prompt = np.arange(10, 10 + prompt_len)
    s.add_request(rid, prompt, max_tokens, [], expected_output_len=max_tokens)


def _step(s: Scheduler) -> list[int]:
    out = s.schedule()
    assert out is not None
    return [f.id for f in s.update(np.full(out.batch.num_sampled_tokens, 5))]


def test_invalid_policy_raises_value_error():
    with pytest.raises(ValueError, match="allocation_policy must be one of"):
        Scheduler(64, 1, 8, 256, 64, allocation_policy="orca")


def test_reserving_policy_rejects_forks_and_parallel_sampling():
    s = _sched("reserve-oracle", 64, 64)
    with pytest.raises(ValueError, match="paged"):
        s.add_request(1, np.arange(4), 4, [], child_ids=[2])
    _add(s, 1, 4, 4)
    _step(s)
    with pytest.raises(ValueError, match="paged"):
        s.fork(1, 9)


def test_share_accounting_on_a_hand_computed_case():
    # 10 one-token slots, oracle reservations: A (2 + 2) [0, 4), B (2 + 1)
    # [4, 7), C (1 + 2) [7, 10). B finishes after its first token; D (3 + 2)
    # needs a run of 5 but only [4, 7) is free: it waits.
    s = _sched("reserve-oracle", 10, 10)
    for rid, (p, o) in enumerate([(2, 2), (2, 1), (1, 2)]):
        _add(s, rid, p, o)
    assert _step(s) == [1]
    _add(s, 3, 3, 2)
    s.schedule()
    m = s.memory_breakdown()
    # A: 3 KV states (2 prompt + 1 generated), final KV length 2 + 2 - 1 = 3,
    # 4 slots -> 1 internal. C: 2 states, final 2, 3 slots -> 1 internal.
    # The 3 free slots cannot fit D: external.
    assert m.total_slots == 10
    assert {k: getattr(m, k) for k in SHARES} == {
        "token_states": 5,
        "reservation": 0,
        "internal": 2,
        "external": 3,
        "free": 0,
    }
    assert (m.num_running, m.num_waiting, m.admission_block) == (2, 1, "memory")
    s.update(np.full(2, 5))
    s.schedule()  # A and C are done: D takes [0, 5)
    m = s.memory_breakdown()
    assert (m.token_states, m.reservation, m.internal, m.free) == (3, 1, 1, 5)
    assert sum(getattr(m, k) for k in SHARES) == m.total_slots


def test_paged_shares_count_the_tail_of_the_last_block():
    s = _sched("paged", 32, 32, block_size=4)
    _add(s, 0, 6, 4)  # final KV length 6 + 4 - 1 = 9: 3 blocks
    s.schedule()
    m = s.memory_breakdown()
    assert (m.token_states, m.reservation, m.internal, m.free) == (6, 2, 0, 24)
    for _ in range(3):
        s.update(np.full(1, 5))
        s.schedule()
    m = s.memory_breakdown()
    assert (m.token_states, m.reservation, m.internal, m.free) == (9, 0, 3, 20)
    assert m.external == 0 and m.admission_block == "none"


def _token_share(policy: str, block_size: int, lens: list[tuple[int, int]]) -> tuple[float, float]:
    """Mean token-state share and batch size over steps with requests waiting."""
    s = _sched(policy, 2048, 512, block_size)
    for rid, (p, o) in enumerate(lens):
        _add(s, rid, p, o)
    tokens = running = steps = 0
    while s.has_unfinished_requests():
        out = s.schedule()
        m = s.memory_breakdown()
        assert sum(getattr(m, k) for k in SHARES) == m.total_slots
        if m.num_waiting:
            tokens += m.token_states / m.total_slots
            running += m.num_running
            steps += 1
        s.update(np.full(out.batch.num_sampled_tokens, 5))
    st = s.stats()
    assert st.num_free_blocks == st.num_total_blocks
    return tokens / steps, running / steps


def test_paged_holds_more_token_states_than_oracle_than_max():
    rng = np.random.default_rng(0)
    lens = [(int(rng.integers(4, 100)), int(rng.integers(4, 150))) for _ in range(60)]
    paged, b_paged = _token_share("paged", 16, lens)
    oracle, b_oracle = _token_share("reserve-oracle", 1, lens)
    worst, b_max = _token_share("reserve-max", 1, lens)
    assert paged > oracle > worst
    assert b_paged > b_oracle > b_max == 4  # 2048 slots hold 4 x 512


def test_static_batch_admits_no_joins():
    s = _sched("static", 300, 100)
    _add(s, 0, 5, 2)
    _add(s, 1, 5, 6)
    _step(s)
    _add(s, 2, 5, 2)  # fits in memory, but the batch is running
    done = []
    while 1 not in done:
        s.schedule()
        m = s.memory_breakdown()
        assert m.num_waiting == 1 and m.admission_block == "batch"
        done += [f.id for f in s.update(np.full(m.num_running, 5))]
    s.schedule()
    assert s.memory_breakdown().num_running == 1


@pytest.mark.parametrize("policy", ["reserve-max", "reserve-pow2", "reserve-oracle", "static"])
def test_engine_outputs_equal_under_every_policy(tiny_model_dir, tiny_reference, policy) -> None:
    """The baselines change where K/V lives, never what the model computes."""
    from pagedrs import LLM, SamplingParams

    llm = LLM(
        model=str(tiny_model_dir),
        block_size=1,
        allocation_policy=policy,
        max_model_len=128,
        num_gpu_blocks_override=300,
    )
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == tiny_reference
    stats = llm.llm_engine.engine_core.scheduler.stats()
    assert stats.allocation_policy == policy
    assert stats.num_free_blocks == 300


def test_engine_rejects_unknown_policy() -> None:
    from pagedrs import LLM

    with pytest.raises(ValueError, match="allocation_policy"):
        LLM(allocation_policy="orca")
