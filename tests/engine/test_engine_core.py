"""The engine core's loop (``CoreLoop`` over an ``EngineCore``) in this process:
its messages survive msgpack, its deltas add up to the offline engine's tokens,
StopSequence and aborts free blocks, bad input and a failing step are reported
per request while the others go on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
from pagedrs import LLM, EngineArgs, SamplingParams
from pagedrs.engine.core.core_proc import CoreLoop
from pagedrs.engine.core.engine_core import EngineCore
from pagedrs.engine.core.messages import (
    AbortRequests,
    AddRequest,
    CoreOutputs,
    StopSequence,
    input_decoder,
    output_decoder,
)

PROMPT = [1, 450, 7483, 310, 3444, 338]
POISON_SEED = 4242


def _core(model_dir: Path, **kwargs: Any) -> CoreLoop:
    args = EngineArgs(model=str(model_dir), max_model_len=256, **kwargs)
    return CoreLoop(EngineCore(args))


@pytest.fixture
def core(tiny_model_dir: Path) -> CoreLoop:
    return _core(tiny_model_dir)


def _wire(out: CoreOutputs) -> CoreOutputs:
    """The outputs as the front end decodes them."""
    msg = output_decoder().decode(msgspec.msgpack.encode(out))
    assert isinstance(msg, CoreOutputs)
    return msg


def _run(core: CoreLoop, max_steps: int = 400) -> tuple[dict[str, dict[int, list[int]]], Any]:
    tokens: dict[str, dict[int, list[int]]] = {}
    errors = []
    for _ in range(max_steps):
        out = _wire(core.step())
        errors += out.errors
        for d in out.deltas:
            for sd in d.seqs:
                tokens.setdefault(d.request_id, {}).setdefault(sd.index, []).extend(sd.token_ids)
        if not core.has_work():
            break
    return tokens, errors


def _free(core: CoreLoop) -> bool:
    s = core.core.kv_cache_stats()
    return s["num_free_blocks"] == s["num_total_blocks"]


def test_inputs_round_trip_msgpack() -> None:
    params = SamplingParams(n=2, temperature=0.5, stop=["x"], seed=3, logprobs=2)
    msgs = [
        AddRequest("r", PROMPT, params, 1.5, "salt", -3),
        AbortRequests(["a", "b"]),
        StopSequence("r", 1, "x"),
    ]
    dec = input_decoder()
    assert [dec.decode(msgspec.msgpack.encode(m)) for m in msgs] == msgs
    bad = msgspec.msgpack.encode(AddRequest("r", PROMPT, SamplingParams(), 0.0))
    with pytest.raises(msgspec.ValidationError, match="n must be"):
        dec.decode(_with_n(bad))


def _with_n(raw: bytes) -> bytes:
    obj = msgspec.msgpack.decode(raw)
    obj[3]["n"] = 0  # [tag, request_id, prompt, params, ...]
    return msgspec.msgpack.encode(obj)


def test_deltas_add_up_to_offline_tokens(core: CoreLoop, tiny_model_dir: Path) -> None:
    params = [
        SamplingParams(max_tokens=12, temperature=0.0),
        SamplingParams(n=3, max_tokens=10, temperature=1.0, seed=11),
    ]
    for i, p in enumerate(params):
        core.apply(AddRequest(f"r{i}", PROMPT, p, 0.0))
    tokens, errors = _run(core)
    assert errors == []
    offline = LLM(str(tiny_model_dir), max_model_len=256).generate(
        [{"prompt_token_ids": PROMPT}] * 2, params, use_tqdm=False
    )
    for i, ref in enumerate(offline):
        assert [tokens[f"r{i}"][o.index] for o in ref.outputs] == [o.token_ids for o in ref.outputs]
    assert _free(core)


def test_stop_sequence_and_abort_free_blocks(core: CoreLoop) -> None:
    long = SamplingParams(n=2, max_tokens=200, temperature=1.0, seed=1, ignore_eos=True)
    core.apply(AddRequest("a", PROMPT, long, 0.0))
    core.apply(AddRequest("b", PROMPT, long, 0.0))
    for _ in range(3):
        core.step()
    core.apply(StopSequence("a", 0, "stop!"))
    core.apply(StopSequence("a", 1, "stop!"))
    core.apply(AbortRequests(["b"]))
    assert core.core.registry.get("a") is None and core.core.registry.get("b") is None
    assert not core.has_work() and _free(core)
    out = _wire(core.step())
    assert out.deltas == [] and out.step_time == 0.0 and out.num_added == 0


def test_failing_step_is_per_request(tiny_model_dir: Path) -> None:
    core = _core(tiny_model_dir, max_num_seqs=1)  # the poisoned request steps alone
    sampler = core.core.sampler

    def poisoned(logits: Any, batch: Any, extras: Any, bitmask: Any = None) -> Any:
        if (batch.seed == POISON_SEED).any():
            raise RuntimeError("poisoned row")
        return sampler(logits, batch, extras, bitmask)

    core.core.sampler = poisoned  # type: ignore[assignment]
    core.apply(AddRequest("bad", PROMPT, SamplingParams(seed=POISON_SEED, max_tokens=4), 0.0))
    core.apply(AddRequest("good", PROMPT, SamplingParams(max_tokens=4, temperature=0.0), 0.0))
    first = _wire(core.step())
    assert first.num_added == 2
    kinds = {e.request_id: (e.kind, e.message) for e in first.errors}
    tokens, errors = _run(core)
    kinds.update({e.request_id: (e.kind, e.message) for e in errors})
    assert kinds["bad"][0] == "failed" and "poisoned row" in kinds["bad"][1]
    assert len(tokens["good"][0]) == 4
    assert _free(core)
