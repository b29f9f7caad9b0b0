"""Priority scheduling (vLLM's semantics: lower ``priority`` first): outputs stay
those of HF, requests start in priority order, a better request preempts worse
ones when the KV cache or max_num_seqs is the limit, and a priority without
priority scheduling is refused with nothing queued."""

from __future__ import annotations

from pathlib import Path

import pytest
from pagedrs import LLM, LLMEngine, SamplingParams
from pagedrs.engine.arg_utils import EngineArgs
from reference import PROMPTS


def test_priority_orders_starts_and_keeps_outputs(tiny_model_dir: Path, tiny_reference) -> None:
    llm = LLM(
        str(tiny_model_dir),
        max_model_len=128,
        max_num_seqs=1,
        scheduling_policy="priority",
    )
    priority = [3, -1, 2, 0][: len(PROMPTS)] + [5] * max(0, len(PROMPTS) - 4)
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=40, temperature=0.0), priority=priority)
    assert [o.outputs[0].token_ids for o in outs] == tiny_reference
    by_start = sorted(range(len(outs)), key=lambda i: outs[i].metrics.first_token_time)
    assert [priority[i] for i in by_start] == sorted(priority)
    stats = llm.kv_cache_stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"]


@pytest.mark.parametrize("limit", ["max_num_seqs", "kv_cache"])
def test_better_request_preempts_a_worse_running_one(tiny_model_dir: Path, limit: str) -> None:
    kwargs = (
        {"max_num_seqs": 1}
        if limit == "max_num_seqs"
        else {"block_size": 8, "num_gpu_blocks_override": 16, "max_model_len": 128}
    )
    engine = LLMEngine(
        EngineArgs(model=str(tiny_model_dir), scheduling_policy="priority", **kwargs)
    )
    params = SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)
    long_prompt = " ".join(["word"] * 60)
    engine.add_request("low-a", long_prompt, params, priority=1)
    engine.add_request("low-b", long_prompt, params, priority=1)
    for _ in range(3):
        engine.step()
    engine.add_request("high", PROMPTS[0], SamplingParams(max_tokens=4), priority=0)
    done: list[str] = []
    while engine.has_unfinished_requests():
        done += [o.request_id for o in engine.step() if o.finished]
    assert done[0] == "high"
    stats = engine.kv_cache_stats()
    assert stats["num_preemptions"] >= 1
    assert stats["num_free_blocks"] == stats["num_total_blocks"]


def test_priority_without_priority_scheduling_is_refused(tiny_model_dir: Path) -> None:
    llm = LLM(str(tiny_model_dir), max_model_len=128)
    with pytest.raises(ValueError, match="priority scheduling is not enabled"):
        llm.generate(
            PROMPTS, SamplingParams(max_tokens=4), priority=[0, 1] + [0] * (len(PROMPTS) - 2)
        )
    with pytest.raises(ValueError, match="2 priorities"):
        llm.generate(PROMPTS, SamplingParams(max_tokens=4), priority=[0, 0])
    assert not llm.llm_engine.has_unfinished_requests()
    prio = LLM(str(tiny_model_dir), max_model_len=128, scheduling_policy="priority")
    for bad, match in ((2**63, "signed 64-bit"), (1.5, "an integer"), (True, "an integer")):
        with pytest.raises(ValueError, match=match):
            prio.generate(PROMPTS[:1], SamplingParams(max_tokens=4), priority=[bad])
    with pytest.raises(ValueError, match="a list of integers"):
        prio.generate(PROMPTS[:1], SamplingParams(max_tokens=4), priority=3)  # type: ignore[arg-type]
    assert not prio.llm_engine.has_unfinished_requests()
    chat = [{"role": "user", "content": "Hi"}]
    with pytest.raises(ValueError, match="priority scheduling is not enabled"):
        llm.chat(chat, SamplingParams(max_tokens=2), use_tqdm=False, priority=[1])
    out = prio.chat(chat, SamplingParams(max_tokens=2), use_tqdm=False, priority=[-4])
    assert out[0].finished
    with pytest.raises(ValueError, match="scheduling_policy must be one of"):
        EngineArgs(model=str(tiny_model_dir), scheduling_policy="lifo")
