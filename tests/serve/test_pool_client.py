"""``ReplicaPoolClient`` over a fake deployment handle (no Ray cluster): outputs
streamed through, a replica dying before or after its first output, the
replicas' errors unwrapped, cancellation, stats summed over replicas."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

ray_exceptions = pytest.importorskip("ray.exceptions")

from pagedrs import SamplingParams  # noqa: E402
from pagedrs.engine.async_base import EngineDeadError, QueueFullError  # noqa: E402
from pagedrs.outputs import CompletionOutput, RequestOutput  # noqa: E402
from pagedrs.serve.pool_client import ReplicaPoolClient  # noqa: E402
from pagedrs.serve.replica import ReplicaInfo, ReplicaOutput, ReplicaRequest  # noqa: E402

INFO = ReplicaInfo(
    max_model_len=64, vocab_size=100, max_num_seqs=4, block_size=8, scheduling_policy="fcfs"
)


def _output(rid: str, tokens: list[int], finished: bool) -> RequestOutput:
    text = " ".join(map(str, tokens))
    c = CompletionOutput(0, text, tokens, finish_reason="length" if finished else None)
    return RequestOutput(rid, "p", [1, 2, 3], [c], finished)


class FakeResponse:
    """A streamed response: yields ``items``, then raises ``error`` if set."""

    def __init__(self, items: list[ReplicaOutput], error: BaseException | None) -> None:
        self.items, self.error = list(items), error
        self.cancelled = False

    def __aiter__(self) -> FakeResponse:
        return self

    async def __anext__(self) -> ReplicaOutput:
        if self.items:
            return self.items.pop(0)
        if self.error is not None:
            raise self.error
        raise StopAsyncIteration

    def cancel(self) -> None:
        self.cancelled = True


class FakeHandle:
    """``handle.options(stream=True).generate.remote(request)``: each call
    answers with the next of ``attempts`` (a function of the request)."""

    def __init__(self, attempts: list[Callable[[ReplicaRequest], FakeResponse]]) -> None:
        self.attempts = attempts
        self.requests: list[ReplicaRequest] = []
        self.responses: list[FakeResponse] = []
        self.generate = self

    def options(self, **_: Any) -> FakeHandle:
        return self

    def remote(self, request: ReplicaRequest) -> FakeResponse:
        self.requests.append(request)
        response = self.attempts[len(self.requests) - 1](request)
        self.responses.append(response)
        return response


def _stream(rank: int, stats: dict[str, Any]) -> Callable[[ReplicaRequest], FakeResponse]:
    def answer(req: ReplicaRequest) -> FakeResponse:
        rid = req.request_id
        return FakeResponse(
            [
                ReplicaOutput(_output(rid, [5], False), rank),
                ReplicaOutput(_output(rid, [5, 6], True), rank, stats),
            ],
            None,
        )

    return answer


def _dies(after_first: bool) -> Callable[[ReplicaRequest], FakeResponse]:
    def answer(req: ReplicaRequest) -> FakeResponse:
        items = [ReplicaOutput(_output(req.request_id, [5], False), 0)] if after_first else []
        return FakeResponse(items, ray_exceptions.ActorDiedError())

    return answer


def _fails(exc: BaseException) -> Callable[[ReplicaRequest], FakeResponse]:
    def answer(_: ReplicaRequest) -> FakeResponse:
        return FakeResponse([], ray_exceptions.RayTaskError("generate", "traceback", exc))

    return answer


class Tokenizer:
    def __call__(self, text: str) -> Any:
        class Enc:
            input_ids = [len(w) for w in text.split()]

        return Enc()


async def _collect(client: ReplicaPoolClient, prompt: Any, rid: str = "r1") -> list[RequestOutput]:
    params = SamplingParams(max_tokens=2)
    return [o async for o in client.generate(prompt, params, rid, cache_salt="s")]


def test_streams_outputs_and_sums_stats() -> None:
    stats = [{"prefix_cache_queries": 10, "prefix_cache_hits": 4, "num_total_blocks": 8}, {}]
    stats[1] = {"prefix_cache_queries": 6, "prefix_cache_hits": 1, "num_total_blocks": 8}
    handle = FakeHandle([_stream(0, stats[0]), _stream(1, stats[1])])
    client = ReplicaPoolClient(handle, INFO, Tokenizer())
    seen: list[RequestOutput] = []
    client.add_output_listener(seen.append)
    outs = asyncio.run(_collect(client, "a bb ccc"))
    assert [o.outputs[0].token_ids for o in outs] == [[5], [5, 6]] and outs[-1].finished
    assert seen == outs
    req = handle.requests[0]
    assert (req.prompt, req.prompt_token_ids, req.cache_salt) == ("a bb ccc", [1, 2, 3], "s")
    asyncio.run(_collect(client, {"prompt_token_ids": [7, 8]}, "r2"))
    assert handle.requests[1].prompt is None and handle.requests[1].prompt_token_ids == [7, 8]
    total = client.kv_cache_stats()
    assert (total["prefix_cache_queries"], total["prefix_cache_hits"]) == (16, 5)
    assert total["num_total_blocks"] == 16 and set(total["per_replica"]) == {0, 1}


def test_replica_dying_before_any_output_is_retried() -> None:
    handle = FakeHandle([_dies(after_first=False), _stream(1, {})])
    client = ReplicaPoolClient(handle, INFO, Tokenizer())
    outs = asyncio.run(_collect(client, "x"))
    assert outs[-1].finished and len(handle.requests) == 2
    assert handle.requests[0] is handle.requests[1]


def test_replica_dying_after_an_output_fails_the_request() -> None:
    handle = FakeHandle([_dies(after_first=True), _stream(1, {})])
    client = ReplicaPoolClient(handle, INFO, Tokenizer())
    got: list[RequestOutput] = []

    async def run() -> None:
        async for o in client.generate("x", SamplingParams(max_tokens=2), "r9"):
            got.append(o)

    with pytest.raises(EngineDeadError, match="engine replica serving request r9 died"):
        asyncio.run(run())
    assert len(got) == 1 and len(handle.requests) == 1


def test_every_attempt_dying_fails_the_request() -> None:
    handle = FakeHandle([_dies(after_first=False)] * 2)
    client = ReplicaPoolClient(handle, INFO, Tokenizer(), max_attempts=2)
    with pytest.raises(EngineDeadError, match="died"):
        asyncio.run(_collect(client, "x"))
    assert len(handle.requests) == 2


def test_replica_errors_are_unwrapped() -> None:
    for exc, kind in (
        (QueueFullError("the waiting queue is full"), QueueFullError),
        (ValueError("bad prompt"), ValueError),
    ):
        client = ReplicaPoolClient(FakeHandle([_fails(exc)]), INFO, Tokenizer())
        with pytest.raises(kind, match=str(exc)):
            asyncio.run(_collect(client, "x"))


def test_leaving_early_and_abort_cancel_the_replica_stream() -> None:
    handle = FakeHandle([_stream(0, {}), _stream(0, {})])
    client = ReplicaPoolClient(handle, INFO, Tokenizer())

    async def first_only() -> None:
        gen = client.generate("x", SamplingParams(max_tokens=2), "r1")
        await gen.__anext__()
        await client.abort("r1")
        assert handle.responses[0].cancelled
        await gen.aclose()

    asyncio.run(first_only())

    async def leave() -> None:
        gen = client.generate("x", SamplingParams(max_tokens=2), "r2")
        await gen.__anext__()
        await gen.aclose()

    asyncio.run(leave())
    assert handle.responses[1].cancelled
    client.shutdown()
    with pytest.raises(EngineDeadError):
        asyncio.run(_collect(client, "x", "r3"))
