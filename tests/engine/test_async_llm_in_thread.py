"""AsyncLLM with its engine core on a thread of this process
(``engine_core_process=False``): streams equal offline outputs, abort frees
blocks at once, bad requests fail alone, a failing step fails only its
requests, the event loop never waits for a step, the waiting queue is bounded,
shutdown is clean."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pagedrs import LLM, EngineArgs, RequestOutput, SamplingParams
from pagedrs.engine.async_llm import (
    AsyncLLM,
    EngineDeadError,
    QueueFullError,
    RequestFailedError,
)
from reference import PROMPTS

GREEDY = SamplingParams(max_tokens=16, temperature=0.0)
LONG = SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)
POISON_SEED = 4242


@pytest.fixture
def make_engine(tiny_model_dir: Path) -> Iterator[Any]:
    engines: list[AsyncLLM] = []

    def make(**kwargs: Any) -> AsyncLLM:
        wait = kwargs.pop("max_waiting_requests", 1024)
        args = EngineArgs(model=str(tiny_model_dir), max_model_len=256, **kwargs)
        engines.append(AsyncLLM(args, max_waiting_requests=wait, engine_core_process=False))
        return engines[-1]

    yield make
    for e in engines:
        e.shutdown()


def _all_free(engine: AsyncLLM) -> bool:
    s = engine.kv_cache_stats()
    return s["num_free_blocks"] == s["num_total_blocks"] and s["num_running"] == 0


async def _wait_free(engine: AsyncLLM, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not _all_free(engine):
        assert time.monotonic() < deadline, f"blocks still used: {engine.kv_cache_stats()}"
        await asyncio.sleep(0.02)


async def _collect(
    engine: AsyncLLM, prompt: str, params: SamplingParams, rid: str
) -> list[RequestOutput]:
    return [out async for out in engine.generate(prompt, params, rid)]


def test_streams_match_offline_generation(make_engine: Any, tiny_model_dir: Path) -> None:
    engine = make_engine(batch_invariant=True)
    prompts = PROMPTS[:4]

    async def run() -> list[list[RequestOutput]]:
        return await asyncio.gather(
            *[_collect(engine, p, GREEDY, f"r{i}") for i, p in enumerate(prompts)]
        )

    streams = asyncio.run(run())
    # Both engines batch-invariant: the async one batches as requests arrive.
    offline = LLM(str(tiny_model_dir), max_model_len=256, batch_invariant=True).generate(
        prompts, GREEDY, use_tqdm=False
    )
    for outs, ref in zip(streams, offline, strict=True):
        assert [o.finished for o in outs] == [False] * (len(outs) - 1) + [True]
        texts = [o.outputs[0].text for o in outs]
        assert all(b.startswith(a) for a, b in zip(texts, texts[1:], strict=False))
        assert outs[-1].outputs[0].token_ids == ref.outputs[0].token_ids
        assert outs[-1].outputs[0].text == ref.outputs[0].text
        assert outs[-1].metrics is not None and outs[-1].metrics.first_token_time is not None
    assert _all_free(engine)


def test_abort_frees_blocks_and_ends_the_stream(make_engine: Any) -> None:
    engine = make_engine()

    async def run() -> RequestOutput:
        gen = engine.generate("Tell me a long story", LONG, "victim")
        await gen.__anext__()
        await gen.__anext__()
        assert engine.kv_cache_stats()["num_used_blocks"] > 0
        await engine.abort("victim")
        last = [out async for out in gen][-1]
        assert _all_free(engine)  # published before the final output is delivered
        return last

    last = asyncio.run(run())
    assert last.finished and last.outputs[0].finish_reason == "abort"
    assert len(last.outputs[0].token_ids) < LONG.max_tokens


def test_leaving_the_iteration_aborts(make_engine: Any) -> None:
    engine = make_engine()

    async def run() -> None:
        gen = engine.generate("Tell me a long story", LONG, "closed")
        await gen.__anext__()
        await gen.aclose()
        await _wait_free(engine)
        async for _ in engine.generate("Another long story", LONG, "broken"):
            break  # the dropped generator is finalized and aborts
        await _wait_free(engine)

        async def consume() -> None:
            async for _ in engine.generate("A third long story", LONG, "cancelled"):
                pass

        task = asyncio.ensure_future(consume())
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await _wait_free(engine)

    asyncio.run(run())


def test_bad_requests_fail_alone(make_engine: Any) -> None:
    engine = make_engine()

    async def run() -> None:
        good = asyncio.ensure_future(_collect(engine, "Hello", GREEDY, "good"))
        with pytest.raises(ValueError, match="empty"):
            await _collect(engine, "", GREEDY, "empty")
        with pytest.raises(ValueError, match="max_model_len"):
            await _collect(engine, "word " * 300, GREEDY, "long")
        with pytest.raises(ValueError, match="token ids"):
            await _collect(engine, {"prompt_token_ids": [10**9]}, GREEDY, "vocab")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="prompt"):
            await _collect(engine, 3.5, GREEDY, "type")  # type: ignore[arg-type]
        dup = engine.generate("Hello", LONG, "dup")
        await dup.__anext__()
        with pytest.raises(ValueError, match="already in use"):
            await _collect(engine, "Hello", GREEDY, "dup")
        await dup.aclose()
        outs = await good
        assert outs[-1].finished and len(outs[-1].outputs[0].token_ids) >= 1
        await _wait_free(engine)

    asyncio.run(run())


def test_failing_step_fails_only_its_requests(make_engine: Any) -> None:
    engine = make_engine(max_num_seqs=1)
    sampler = engine._client.core.sampler

    def poisoned(logits: Any, batch: Any, extras: Any, bitmask: Any = None) -> Any:
        if (batch.seed == POISON_SEED).any():
            raise RuntimeError("poisoned row")
        return sampler(logits, batch, extras, bitmask)

    engine._client.core.sampler = poisoned
    poison = SamplingParams(max_tokens=8, temperature=1.0, seed=POISON_SEED)

    async def run() -> None:
        bad = asyncio.ensure_future(_collect(engine, "Poison", poison, "bad"))
        await asyncio.sleep(0)  # queued first: scheduled alone (max_num_seqs=1)
        good = asyncio.ensure_future(_collect(engine, "Hello", GREEDY, "good"))
        with pytest.raises(RequestFailedError, match="poisoned row"):
            await bad
        outs = await good
        assert outs[-1].finished and outs[-1].outputs[0].finish_reason is not None
        again = await _collect(engine, "Hello again", GREEDY, "again")
        assert again[-1].finished
        await _wait_free(engine)

    asyncio.run(run())
    assert engine.is_running


def test_event_loop_runs_during_slow_steps(make_engine: Any) -> None:
    engine = make_engine()
    step = engine._client.core.step

    def slow_step() -> Any:
        time.sleep(0.3)
        return step()

    engine._client.core.step = slow_step

    async def run() -> float:
        gaps: list[float] = []
        task = asyncio.ensure_future(
            _collect(engine, "Hi", SamplingParams(max_tokens=4, temperature=0.0), "slow")
        )
        last = time.perf_counter()
        while not task.done():
            await asyncio.sleep(0.01)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now
        outs = await task
        assert len(outs[-1].outputs[0].token_ids) == 4
        return max(gaps)

    assert asyncio.run(run()) < 0.25  # steps take >= 0.3 s each


def test_waiting_queue_is_bounded(make_engine: Any) -> None:
    engine = make_engine(max_num_seqs=1, max_waiting_requests=2)

    async def run() -> None:
        running = engine.generate("Running", LONG, "a")
        await running.__anext__()  # "a" holds the only seat
        waiting = [engine.generate("Waiting", LONG, r) for r in ("b", "c")]
        firsts = [asyncio.ensure_future(g.__anext__()) for g in waiting]
        await asyncio.sleep(0.05)
        with pytest.raises(QueueFullError, match="max_waiting_requests=2"):
            await engine.generate("Rejected", GREEDY, "d").__anext__()
        for f in firsts:
            f.cancel()
        await asyncio.gather(*firsts, return_exceptions=True)
        await running.aclose()
        await _wait_free(engine)
        outs = await _collect(engine, "Accepted again", GREEDY, "e")
        assert outs[-1].finished

    asyncio.run(run())


def test_shutdown_fails_live_requests(make_engine: Any) -> None:
    engine = make_engine()

    async def run() -> None:
        gen = engine.generate("Tell me a long story", LONG, "live")
        await gen.__anext__()
        await asyncio.to_thread(engine.shutdown)
        with pytest.raises(EngineDeadError):
            async for _ in gen:
                pass
        with pytest.raises(EngineDeadError):
            await _collect(engine, "Too late", GREEDY, "late")
        with pytest.raises(EngineDeadError):
            await engine.check_health()

    asyncio.run(run())
    assert not engine.is_running
    stats = engine._client.core.kv_cache_stats()  # the worker has stopped: safe to read directly
    assert stats["num_free_blocks"] == stats["num_total_blocks"]


def test_invalid_queue_bound(tiny_model_dir: Path) -> None:
    with pytest.raises(ValueError, match="max_waiting_requests"):
        AsyncLLM(
            EngineArgs(model=str(tiny_model_dir)),
            max_waiting_requests=0,
            engine_core_process=False,
        )
