"""AsyncLLM over both of its core transports, the engine core in its own
process (the default) and on a thread of this one (``engine_core_process=False``):
outputs equal the offline engine's (stop strings found by the front end, n > 1,
best_of, logprobs, prompt logprobs), aborts and disconnects free every block in
the core, bad input fails alone, the waiting queue is bounded, shutdown is
clean; in a process, a killed core fails every open request and makes /health
503; on a thread, a failing step fails only its requests and the event loop
never waits for a step."""

from __future__ import annotations

import asyncio
import os
import signal
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
from pagedrs.entrypoints.openai.api_server import build_app
from reference import PROMPTS
from starlette.testclient import TestClient

GREEDY = SamplingParams(max_tokens=16, temperature=0.0)
LONG = SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)
POISON_SEED = 4242
# The core's transports: its own process, or a thread of this one.
TRANSPORTS = ["process", "thread"]
CASES = [
    ("Name three rivers.", SamplingParams(max_tokens=24, temperature=0.0, stop=["\n", "."])),
    ("Hi, who are you?", SamplingParams(max_tokens=20, temperature=0.0, logprobs=3)),
    (
        "Write a haiku about the sea.",
        SamplingParams(n=3, max_tokens=20, temperature=0.9, seed=7, stop=[","]),
    ),
    ("1 2 3 4", SamplingParams(n=2, best_of=3, max_tokens=12, temperature=1.0, seed=3)),
    ("The capital of France is", SamplingParams(max_tokens=8, temperature=0.0, prompt_logprobs=2)),
    ("Count: one, two,", SamplingParams(max_tokens=16, temperature=0.0, stop=[" five"])),
]


@pytest.fixture(scope="module", params=TRANSPORTS)
def default_engine(default_model_dir: Path, request: pytest.FixtureRequest) -> Iterator[AsyncLLM]:
    # Batch-invariant projections: the async engine batches the cases as they
    # arrive, the offline engine all at once; each row's bits are then the same.
    engine = AsyncLLM(
        EngineArgs(model=str(default_model_dir), max_model_len=512, batch_invariant=True),
        engine_core_process=request.param == "process",
    )
    yield engine
    engine.shutdown()
    assert not engine.is_running


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make_engine(tiny_model_dir: Path, transport: str) -> Iterator[Any]:
    engines: list[AsyncLLM] = []

    def make(**kwargs: Any) -> AsyncLLM:
        wait = kwargs.pop("max_waiting_requests", 1024)
        args = EngineArgs(model=str(tiny_model_dir), max_model_len=256, **kwargs)
        engines.append(
            AsyncLLM(
                args,
                max_waiting_requests=wait,
                torch_threads=1,
                engine_core_process=transport == "process",
            )
        )
        return engines[-1]

    yield make
    for e in engines:
        e.shutdown()


def _all_free(engine: AsyncLLM) -> bool:
    s = engine.kv_cache_stats()
    return s["num_free_blocks"] == s["num_total_blocks"] and s["num_running"] == 0


async def _wait_free(engine: AsyncLLM, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not _all_free(engine):
        assert time.monotonic() < deadline, f"blocks still used: {engine.kv_cache_stats()}"
        await asyncio.sleep(0.02)


async def _collect(
    engine: AsyncLLM, prompt: Any, params: SamplingParams, rid: str
) -> list[RequestOutput]:
    return [out async for out in engine.generate(prompt, params, rid)]


def test_outputs_equal_the_offline_engine(
    default_engine: AsyncLLM, default_model_dir: Path
) -> None:
    finals: list[RequestOutput] = []
    default_engine.add_output_listener(lambda o: finals.append(o) if o.finished else None)

    async def run() -> list[list[RequestOutput]]:
        return await asyncio.gather(
            *[_collect(default_engine, p, sp, f"case{i}") for i, (p, sp) in enumerate(CASES)]
        )

    streams = asyncio.run(run())
    llm = LLM(str(default_model_dir), max_model_len=512, batch_invariant=True)
    offline = llm.generate([p for p, _ in CASES], [sp for _, sp in CASES], use_tqdm=False)
    for outs, ref in zip(streams, offline, strict=True):
        got = outs[-1]
        assert got.finished and [o.finished for o in outs[:-1]] == [False] * (len(outs) - 1)
        assert len(got.outputs) == len(ref.outputs)
        for a, b in zip(got.outputs, ref.outputs, strict=True):
            assert (a.index, a.text, a.token_ids) == (b.index, b.text, b.token_ids)
            assert (a.finish_reason, a.stop_reason) == (b.finish_reason, b.stop_reason)
            # Equal bits, not a tolerance: both engines run batch-invariant projections.
            assert a.cumulative_logprob == b.cumulative_logprob
            assert [list(p.items()) for p in a.logprobs or []] == [
                list(p.items()) for p in b.logprobs or []
            ]
            assert (a.logprobs is None) == (b.logprobs is None)
        if ref.prompt_logprobs is not None:
            assert got.prompt_logprobs is not None
            assert len(got.prompt_logprobs) == len(ref.prompt_logprobs)
            for pa, pb in zip(got.prompt_logprobs[1:], ref.prompt_logprobs[1:], strict=True):
                assert pa == pb
    assert any(o.stop_reason in (".", "\n", ",", " five") for s in streams for o in s[-1].outputs)
    assert sorted(o.request_id for o in finals) == sorted(f"case{i}" for i in range(len(CASES)))
    asyncio.run(_wait_free(default_engine))


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


def test_abort_and_disconnect_free_every_block(make_engine: Any) -> None:
    engine = make_engine()

    async def run() -> None:
        gen = engine.generate("Tell me a long story", LONG, "victim")
        await gen.__anext__()
        await engine.abort("victim")
        last = [out async for out in gen][-1]
        assert last.finished and last.outputs[0].finish_reason == "abort"
        await _wait_free(engine)
        async for _ in engine.generate("Another long story", LONG, "broken"):
            break  # the dropped generator is finalized and aborts
        await _wait_free(engine)

        streaming = asyncio.Event()

        async def consume() -> None:
            async for _ in engine.generate("A third long story", LONG, "cancelled"):
                streaming.set()

        task = asyncio.ensure_future(consume())
        # Cancelled while it waits for its next output (a client gone mid-stream).
        await streaming.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await _wait_free(engine)
        outs = await _collect(engine, "Still serving", GREEDY, "after")
        assert outs[-1].finished
        # An id reused at once never sees late tokens of the aborted request.
        gen = engine.generate("Tell me a long story", LONG, "reused")
        await gen.__anext__()
        await engine.abort("reused")
        again = await _collect(engine, "Still serving", GREEDY, "reused")
        assert again[-1].request_id == "reused"
        assert again[-1].outputs[0].token_ids == outs[-1].outputs[0].token_ids

    asyncio.run(run())


def test_bad_requests_fail_alone(make_engine: Any) -> None:
    engine = make_engine(max_logprobs=5)

    async def run() -> None:
        good = asyncio.ensure_future(_collect(engine, "Hello", GREEDY, "good"))
        for prompt, params, match in [
            ("", GREEDY, "empty"),
            ("word " * 300, GREEDY, "max_model_len"),
            ({"prompt_token_ids": [10**9]}, GREEDY, "token ids"),
            (3.5, GREEDY, "prompt"),
            ("Hi", SamplingParams(logprobs=6), "max_logprobs"),
            ("Hi", "not params", "SamplingParams"),
        ]:
            with pytest.raises(ValueError, match=match):
                await _collect(engine, prompt, params, "bad")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="priority"):
            await engine.generate("Hi", GREEDY, "prio", priority=1).__anext__()
        dup = engine.generate("Hello", LONG, "dup")
        await dup.__anext__()
        with pytest.raises(ValueError, match="already in use"):
            await _collect(engine, "Hello", GREEDY, "dup")
        await dup.aclose()
        outs = await good
        assert outs[-1].finished and len(outs[-1].outputs[0].token_ids) >= 1
        await _wait_free(engine)

    asyncio.run(run())


@pytest.mark.parametrize("transport", ["thread"])
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


@pytest.mark.parametrize("transport", ["thread"])
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


@pytest.mark.parametrize("transport", ["process"])
def test_killed_core_fails_open_requests_and_health(make_engine: Any) -> None:
    engine = make_engine()
    http = TestClient(build_app(engine, ["tiny"], shutdown_engine=False))
    assert http.get("/health").status_code == 200

    async def run() -> None:
        gen = engine.generate("Tell me a long story", LONG, "open")
        await gen.__anext__()
        assert engine.core_pid is not None
        os.kill(engine.core_pid, signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(EngineDeadError, match="exited"):
            async for _ in gen:
                pass
        assert time.monotonic() - t0 < 10
        with pytest.raises(EngineDeadError):
            await _collect(engine, "Too late", GREEDY, "late")
        with pytest.raises(EngineDeadError):
            await engine.check_health()

    asyncio.run(run())
    assert http.get("/health").status_code == 503
    assert not engine.is_running


def test_shutdown_fails_live_requests(make_engine: Any, transport: str) -> None:
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

    asyncio.run(run())
    assert not engine.is_running
    if transport == "process":
        assert engine._client.process.exitcode == 0
    else:
        stats = engine._client.core.kv_cache_stats()  # the thread has stopped: safe to read
        assert stats["num_free_blocks"] == stats["num_total_blocks"]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_start_errors(tiny_model_dir: Path, transport: str) -> None:
    own_process = transport == "process"
    with pytest.raises(ValueError, match="max_waiting_requests"):
        AsyncLLM(
            EngineArgs(model=str(tiny_model_dir)),
            max_waiting_requests=0,
            engine_core_process=own_process,
        )
    with pytest.raises(ValueError, match="max_model_len"):
        AsyncLLM(
            EngineArgs(model=str(tiny_model_dir), max_model_len=10**6),
            engine_core_process=own_process,
        )
