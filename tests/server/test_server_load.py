"""The server under load on loopback: clients that disconnect mid-stream get their
requests aborted and blocks freed; 32 concurrent clients get no error; a full
waiting queue answers 503; a request failing in the model loop fails alone."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from engine_core_faults import FaultyEngineArgs
from pagedrs import EngineArgs
from pagedrs.engine.async_llm import AsyncLLM
from pagedrs.entrypoints.openai.api_server import build_app
from server_utils import ServerThread, all_blocks_free, metrics, torch_threads, wait_for

POISON_SEED = 4242


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path) -> Iterator[ServerThread]:
    """The server's default: the engine core in its own process."""
    args = EngineArgs(model=str(tiny_model_dir), max_model_len=256)
    engine = AsyncLLM(args, torch_threads=1)
    with torch_threads(1), ServerThread(build_app(engine, ["tiny"])) as srv:
        yield srv


@pytest.fixture(scope="module")
def small_server(tiny_model_dir: Path) -> Iterator[tuple[ServerThread, AsyncLLM]]:
    """One sequence at a time, one waiting, steps of >= 20 ms; requests with seed
    4242 fail in the sampler. The server's default: the engine core in its own
    process, its step and sampler wrapped there (``engine_core_faults``)."""
    args = FaultyEngineArgs(
        model=str(tiny_model_dir),
        max_model_len=256,
        max_num_seqs=1,
        step_delay_s=0.02,
        poison_seed=POISON_SEED,
    )
    engine = AsyncLLM(args, max_waiting_requests=1, torch_threads=1)
    with torch_threads(1), ServerThread(build_app(engine, ["tiny"])) as srv:
        yield srv, engine


def _long(i: int, **extra: Any) -> dict[str, Any]:
    return {
        "model": "tiny",
        "prompt": f"Story number {i}:",
        "max_tokens": 200,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        **extra,
    }


def _events(lines: list[str]) -> list[dict[str, Any]]:
    return [json.loads(x[6:]) for x in lines if x.startswith("data: {")]


def test_disconnect_aborts_and_frees_blocks(server: ServerThread) -> None:
    before = metrics(server.url).get("pagedrs:request_success_total{abort}", 0.0)

    async def one(client: httpx.AsyncClient, i: int, drop: bool) -> list[str]:
        lines: list[str] = []
        async with client.stream("POST", "/v1/completions", json=_long(i)) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if line:
                    lines.append(line)
                if drop and len(lines) >= 3:
                    break  # leaving the block closes the connection mid-stream
        return lines

    async def run() -> list[list[str]]:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            return await asyncio.gather(*[one(client, i, drop=i % 2 == 0) for i in range(8)])

    results = asyncio.run(run())
    for i, lines in enumerate(results):
        if i % 2 == 0:
            assert len(lines) == 3 and "data: [DONE]" not in lines
            continue
        assert lines[-1] == "data: [DONE]"
        events = _events(lines)
        assert events[-1]["usage"]["completion_tokens"] == 200
        assert events[-2]["choices"][0]["finish_reason"] == "length"
    wait_for(lambda: all_blocks_free(server.url), what="all blocks free")
    after = metrics(server.url)
    assert after["pagedrs:request_success_total{abort}"] - before == 4
    assert after["pagedrs:num_free_blocks"] == after["pagedrs:num_total_blocks"]


def test_32_concurrent_clients(server: ServerThread) -> None:
    """128 requests from 32 clients (completions and chat, streamed and not)."""
    num_clients, per_client = 32, 4
    client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=60)

    async def worker(w: int) -> list[int]:
        counts = []
        for k in range(per_client):
            max_tokens = 4 + (w * per_client + k) % 13
            kind = (w + k) % 4
            if kind == 0:
                r = await client.completions.create(
                    model="tiny", prompt=f"Client {w} request {k}", max_tokens=max_tokens
                )
                counts.append(r.usage.completion_tokens)
            elif kind == 1:
                r = await client.chat.completions.create(
                    model="tiny",
                    messages=[{"role": "user", "content": f"Client {w} says {k}"}],
                    max_tokens=max_tokens,
                    extra_body={"ignore_eos": True},
                )
                assert r.usage.completion_tokens == max_tokens
                counts.append(r.usage.completion_tokens)
            elif kind == 2:
                stream = await client.completions.create(
                    model="tiny",
                    prompt=f"Streaming client {w}, {k}",
                    max_tokens=max_tokens,
                    stream=True,
                    stream_options={"include_usage": True},
                )
                chunks = [c async for c in stream]
                counts.append(chunks[-1].usage.completion_tokens)
            else:
                stream = await client.chat.completions.create(
                    model="tiny",
                    messages=[{"role": "user", "content": f"Stream {w} {k}"}],
                    max_tokens=max_tokens,
                    stream=True,
                    stream_options={"include_usage": True},
                    extra_body={"ignore_eos": True},
                )
                chunks = [c async for c in stream]
                assert chunks[-1].usage.completion_tokens == max_tokens
                counts.append(max_tokens)
        return counts

    async def run() -> list[list[int]]:
        try:
            return await asyncio.wait_for(
                asyncio.gather(*[worker(w) for w in range(num_clients)]), timeout=60
            )
        finally:
            await client.close()

    t0 = time.monotonic()
    results = asyncio.run(run())
    elapsed = time.monotonic() - t0
    assert sum(len(r) for r in results) == num_clients * per_client
    assert all(1 <= c <= 16 for r in results for c in r)
    assert elapsed < 60
    wait_for(lambda: all_blocks_free(server.url), what="all blocks free")
    m = metrics(server.url)
    assert m["pagedrs:e2e_request_latency_seconds_count"] >= num_clients * per_client


def test_full_waiting_queue_answers_503(
    small_server: tuple[ServerThread, AsyncLLM],
) -> None:
    srv, engine = small_server

    async def run() -> None:
        async with httpx.AsyncClient(base_url=srv.url, timeout=60) as client:
            async with client.stream("POST", "/v1/completions", json=_long(1)) as running:
                assert running.status_code == 200
                lines = running.aiter_lines()
                await lines.__anext__()  # "running" holds the only seat
                short = {**_long(2), "stream": False, "max_tokens": 4}
                short.pop("stream_options")
                queued = asyncio.ensure_future(client.post("/v1/completions", json=short))
                deadline = time.monotonic() + 20
                while engine.num_waiting_requests() < 1:
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.02)
                r = await client.post("/v1/completions", json={**short, "prompt": "Third"})
                assert r.status_code == 503
                err = r.json()["error"]
                assert err["type"] == "server_error" and err["code"] == "queue_full"
                assert "max_waiting_requests=1" in err["message"]
            queued_response = await queued  # runs once the stream above is dropped
            assert queued_response.status_code == 200

    asyncio.run(run())
    wait_for(lambda: all_blocks_free(srv.url), what="all blocks free")


def test_request_failing_in_the_model_loop_fails_alone(
    small_server: tuple[ServerThread, AsyncLLM],
) -> None:
    srv, engine = small_server
    client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="x", max_retries=0, timeout=60)
    for stream in (False, True):
        with pytest.raises(openai.InternalServerError) as e:
            r = client.completions.create(
                model="tiny", prompt="Poison", max_tokens=5, seed=POISON_SEED, stream=stream
            )
            list(r) if stream else None  # type: ignore[call-overload]
        assert e.value.status_code == 500
        body = e.value.response.json()["error"]
        assert body["code"] == "request_failed" and "poisoned row" in body["message"]
        ok = client.completions.create(model="tiny", prompt="Fine", max_tokens=5, seed=1)
        assert ok.choices[0].finish_reason in ("length", "stop")
    assert engine.is_running
    assert httpx.get(f"{srv.url}/health").status_code == 200
    wait_for(lambda: all_blocks_free(srv.url), what="all blocks free")


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_non_streaming_disconnect_aborts(
    small_server: tuple[ServerThread, AsyncLLM], path: str
) -> None:
    srv, _ = small_server
    before = metrics(srv.url).get("pagedrs:request_success_total{abort}", 0.0)
    body: dict[str, Any] = {"model": "tiny", "max_tokens": 200, "ignore_eos": True}
    if path.endswith("chat/completions"):
        body["messages"] = [{"role": "user", "content": "Tell a story"}]
    else:
        body["prompt"] = "Tell a story"
    with pytest.raises(httpx.ReadTimeout):  # 200 steps of >= 20 ms: >= 4 s
        httpx.post(srv.url + path, json=body, timeout=httpx.Timeout(30, read=1.0))
    wait_for(lambda: all_blocks_free(srv.url), timeout=3, what="the abort")
    after = metrics(srv.url)["pagedrs:request_success_total{abort}"]
    assert after - before == 1
