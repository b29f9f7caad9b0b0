"""The planner and the engine share the scheduler: the simulator steps the
engine's own ``_core.Scheduler``, and a simulated step's batch is the real
engine's for the same requests and settings (same sequences, query lengths
and context lengths, step by step, preemptions included)."""

from __future__ import annotations

import numpy as np
import pytest
from pagedrs import _core
from pagedrs.plan import PlanConfig, StepTimeModel, load_profile, resolve_model_shape, simulate
from pagedrs.plan.trace import Trace, TraceRequest


def _requests() -> list[TraceRequest]:
    rng = np.random.default_rng(7)
    shared = rng.integers(100, 30000, size=40)
    reqs = []
    for i, (plen, out) in enumerate([(40, 12), (70, 20), (25, 30), (90, 8), (33, 17), (60, 25)]):
        own = rng.integers(100, 30000, size=plen)
        prompt = np.concatenate([shared, own]) if i % 2 else own  # prefix hits on odd ones
        reqs.append(TraceRequest(prompt.astype(np.int64), out))
    return reqs


class _Recorder:
    def __init__(self, inner: object) -> None:
        self._inner = inner
        self.batches: list[tuple[list[int], list[int], list[int]]] = []

    def schedule(self):  # noqa: ANN201
        out = self._inner.schedule()
        if out is not None:
            b = out.batch
            self.batches.append(
                (
                    b.seq_request_ids.tolist(),
                    np.diff(b.query_start_loc).tolist(),
                    b.seq_lens.tolist(),
                )
            )
        return out

    def __getattr__(self, name: str):  # noqa: ANN204
        return getattr(self._inner, name)


@pytest.mark.parametrize("num_blocks", [64, 10])  # 10 blocks: preemption by recompute
def test_simulated_batches_equal_engine_batches(num_blocks: int) -> None:
    from pagedrs import SamplingParams
    from pagedrs.engine.arg_utils import EngineArgs
    from pagedrs.engine.llm_engine import LLMEngine

    reqs = _requests()
    settings = dict(block_size=16, max_num_seqs=4, max_num_batched_tokens=64)
    engine = LLMEngine(
        EngineArgs(
            dtype="float32",
            num_gpu_blocks_override=num_blocks,
            max_model_len=160,
            enable_prefix_caching=True,
            **settings,
        )
    )
    try:
        core = engine.engine_core  # the step and its scheduler live in the engine core
        rec = _Recorder(core.scheduler)
        core.scheduler = rec
        for i, r in enumerate(reqs):
            params = SamplingParams(temperature=0.0, max_tokens=r.output_len, ignore_eos=True)
            engine.add_request(f"r{i}", r.prompt.tolist(), params)
        while engine.has_unfinished_requests():
            engine.step()
        preemptions = engine.kv_cache_stats()["num_preemptions"]
    finally:
        engine.shutdown()
    # engine ids are assigned in add order: map them to the trace's indices
    order = sorted({s for ids, _, _ in rec.batches for s in ids})
    to_index = {sid: i for i, sid in enumerate(order)}
    engine_steps = [([to_index[s] for s in ids], q, n) for ids, q, n in rec.batches]

    model = resolve_model_shape("smollm2-135m")
    sm = StepTimeModel(model, load_profile("h100"))
    cfg = PlanConfig(num_gpu_blocks=num_blocks, enable_prefix_caching=True, **settings)
    res = simulate(Trace("t", reqs, True), cfg, sm, max_model_len=160, record_steps=True)
    assert res.steps is not None
    sim_steps = [(ids.tolist(), q.tolist(), n.tolist()) for _, _, _, _, ids, q, n in res.steps]
    assert len(sim_steps) == len(engine_steps)
    for k, (sim, eng) in enumerate(zip(sim_steps, engine_steps, strict=True)):
        assert sim[0] == eng[0], f"step {k}: sequences differ"
        assert sim[1] == eng[1], f"step {k}: query lengths differ"
        assert sim[2] == eng[2], f"step {k}: context lengths differ"
    assert res.num_preemptions == preemptions
    if num_blocks == 10:
        assert preemptions > 0


def test_simulator_drives_the_core_scheduler() -> None:
    """No scheduling logic in Python: the replica's scheduler is the Rust class."""
    from pagedrs.plan import simulator

    rep = simulator._Replica(
        0,
        PlanConfig(num_gpu_blocks=8),
        8,
        128,
        False,
        StepTimeModel(resolve_model_shape("smollm2-135m"), load_profile("h100")),
    )
    assert type(rep.sched) is _core.Scheduler
