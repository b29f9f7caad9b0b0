"""KV cache events: an engine with ``kv_events_config`` publishes vLLM's
``KVEventBatch`` over ZeroMQ; decoded here with structs written in vLLM's field
order, checked against ``_core.block_hashes`` and ``kv_cache_stats()``."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq
from pagedrs import LLM, SamplingParams, _core
from pagedrs.engine.arg_utils import EngineArgs

BLOCK = 8


class _Batch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]


class _Event(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(_Event):
    block_hashes: list[bytes | int]
    parent_block_hash: bytes | int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class BlockRemoved(_Event):
    block_hashes: list[bytes | int]
    medium: str | None


class AllBlocksCleared(_Event):
    pass


class KVEventBatch(_Batch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
    data_parallel_rank: int | None = None


DECODER = msgspec.msgpack.Decoder(type=KVEventBatch)


def _drain(sub: zmq.Socket, quiet_ms: int = 500) -> list[tuple[int, bytes]]:
    """(seq, payload) of every message until none comes for ``quiet_ms``."""
    got = []
    while sub.poll(quiet_ms):
        topic, seq, payload = sub.recv_multipart()
        assert topic == b"kv-events"
        got.append((int.from_bytes(seq, "big"), payload))
    return got


def _prompt(i: int, n: int) -> dict[str, list[int]]:
    return {"prompt_token_ids": [1000 * (i + 1) + t for t in range(n)]}


@pytest.fixture()
def endpoints(tmp_path: Path) -> tuple[str, str]:
    return f"ipc://{tmp_path}/kv-pub", f"ipc://{tmp_path}/kv-replay"


def test_events_match_block_hashes_and_cache_stats(
    tiny_model_dir: Path, endpoints: tuple[str, str]
) -> None:
    pub, replay = endpoints
    config = {
        "enable_kv_cache_events": True,
        "endpoint": pub,
        "replay_endpoint": replay,
        "topic": "kv-events",
    }
    llm = LLM(
        str(tiny_model_dir),
        device="cpu",
        block_size=BLOCK,
        max_model_len=64,
        num_gpu_blocks_override=10,
        kv_events_config=json.dumps(config),
    )
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv-events")
    sub.connect(pub)
    time.sleep(0.3)  # the subscription reaches the PUB socket
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    try:
        first = _prompt(0, 20)  # 2 full blocks + 4 tokens
        llm.generate([first], params, use_tqdm=False)
        messages = _drain(sub)
        batches = [DECODER.decode(p) for _, p in messages]
        stored = [e for b in batches for e in b.events if isinstance(e, BlockStored)]
        assert len(stored) == 1
        want = _core.block_hashes(first["prompt_token_ids"], BLOCK)
        assert len(want) == 2 and all(len(h) == 32 for h in want)
        assert stored[0].block_hashes == want
        assert stored[0].parent_block_hash is None
        assert stored[0].token_ids == first["prompt_token_ids"][:16]
        assert (stored[0].block_size, stored[0].lora_id, stored[0].medium) == (BLOCK, None, "CPU")

        # Distinct 40-token prompts (5 blocks each) in a 10-block pool: evictions.
        for i in range(1, 6):
            llm.generate([_prompt(i, 40)], params, use_tqdm=False)
        messages += _drain(sub)
        assert [s for s, _ in messages] == list(range(len(messages)))

        held: set[bytes | int] = set()
        n_stored = n_removed = 0
        for _, payload in messages:
            batch = DECODER.decode(payload)
            assert batch.data_parallel_rank is None and batch.ts > 0
            for e in batch.events:
                if isinstance(e, BlockStored):
                    n_stored += len(e.block_hashes)
                    assert not held & set(e.block_hashes)
                    held |= set(e.block_hashes)
                elif isinstance(e, BlockRemoved):
                    assert e.medium == "CPU"
                    n_removed += len(e.block_hashes)
                    assert set(e.block_hashes) <= held
                    held -= set(e.block_hashes)
        stats = llm.kv_cache_stats()
        assert n_removed > 0
        assert n_removed == stats["num_evicted_blocks"]
        # One KV cache group: every cached block was stored once and removed at
        # most once, so the subscriber's view is the cache.
        assert n_stored - n_removed == len(held) == stats["num_cached_blocks"]
        last = _core.block_hashes(_prompt(5, 40)["prompt_token_ids"], BLOCK)
        assert set(last) <= held

        # Replay from sequence 1 returns the same payloads, then the end marker.
        req = ctx.socket(zmq.DEALER)
        req.connect(replay)
        replayed = []
        req.send_multipart((b"", (1).to_bytes(8, "big")))
        while True:
            assert req.poll(2000)
            empty, seq, payload = req.recv_multipart()
            assert empty == b""
            if not payload:
                assert int.from_bytes(seq, "big", signed=True) == -1
                break
            replayed.append((int.from_bytes(seq, "big"), payload))
        assert replayed == messages[1:]
        req.close(linger=0)

        assert llm.reset_prefix_cache()
        (cleared,) = [DECODER.decode(p) for _, p in _drain(sub)]
        assert [type(e) for e in cleared.events] == [AllBlocksCleared]
        assert llm.kv_cache_stats()["num_cached_blocks"] == 0
    finally:
        sub.close(linger=0)
        ctx.term()
        llm.shutdown()


def test_block_hashes_follow_the_cache_salt() -> None:
    tokens = list(range(100, 120))
    plain = _core.block_hashes(tokens, BLOCK)
    assert len(plain) == 2
    assert _core.block_hashes(tokens[:16], BLOCK) == plain
    salted = _core.block_hashes(tokens, BLOCK, cache_salt="tenant-a")
    assert salted[0] != plain[0] and salted[1] != plain[1]
    with pytest.raises(ValueError, match="block_size"):
        _core.block_hashes(tokens, 0)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("{", "not valid JSON"),
        ("[1]", "JSON object"),
        ('{"endpoint_x": 1}', "unknown keys"),
        ('{"publisher": "kafka"}', "publisher"),
        ('{"buffer_steps": 0}', "buffer_steps"),
        ('{"replay_endpoint": 5558}', "replay_endpoint"),
    ],
)
def test_bad_kv_events_config_is_refused(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        EngineArgs(kv_events_config=text)
