"""The prefix-cache routing rule and index (pure Python), and the KV event
subscriber fed by a real engine (no Ray)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest
import zmq
from pagedrs import LLM, SamplingParams, _core
from pagedrs.kv_events import KVEventBatch
from pagedrs.serve.kv_subscriber import KVEventSubscriber
from pagedrs.serve.routing import PrefixCacheIndex, RoutingConfig, choose_replica

H = [bytes([i]) * 32 for i in range(8)]  # a request's chained block hashes


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_index_applies_stored_removed_cleared() -> None:
    index: PrefixCacheIndex[str] = PrefixCacheIndex(expect_ttl_s=0)
    index.stored("a", H[:4])
    index.stored("b", H[:2])
    assert index.matched_blocks(H[:6], ["a", "b", "c"]) == {"a": 4, "b": 2, "c": 0}
    index.removed("a", [H[1]])  # a hole: only the blocks before it count
    assert index.matched_blocks(H[:6], ["a", "b"]) == {"a": 1, "b": 2}
    index.cleared("b")
    assert index.matched_blocks(H[:6], ["a", "b"]) == {"a": 1, "b": 0}
    assert (index.num_blocks("a"), index.num_blocks("b")) == (3, 0)
    index.removed("zz", [H[0]])  # unknown replica: nothing happens
    assert index.matched_blocks(H[:1], ["a"]) == {"a": 1}


def test_expected_blocks_count_until_their_ttl() -> None:
    clock = FakeClock()
    index: PrefixCacheIndex[str] = PrefixCacheIndex(expect_ttl_s=5.0, clock=clock)
    index.expect("a", H[:3])
    assert index.matched_blocks(H[:4], ["a", "b"]) == {"a": 3, "b": 0}
    clock.now += 5.1
    assert index.matched_blocks(H[:4], ["a", "b"]) == {"a": 0, "b": 0}
    index.expect("a", H[:3])
    index.cleared("a")
    assert index.matched_blocks(H[:4], ["a"]) == {"a": 0}


def test_longest_prefix_wins_when_balanced() -> None:
    d = choose_replica({"a": 2, "b": 0, "c": 1}, {"a": 5, "b": 1}, num_blocks=8)
    assert (d.replica, d.reason, d.matched_blocks) == ("a", "prefix", 5)
    # Equal matches: the shorter queue.
    d = choose_replica({"a": 3, "b": 1}, {"a": 4, "b": 4}, num_blocks=8)
    assert (d.replica, d.reason) == ("b", "prefix")


def test_imbalance_sends_to_least_loaded() -> None:
    config = RoutingConfig(balance_abs_threshold=4, balance_rel_threshold=1.5)
    # 9 - 2 > 4 and 9 > 1.5 * 2: imbalanced, whatever the cache holds.
    d = choose_replica({"a": 9, "b": 2}, {"a": 8}, num_blocks=8, config=config)
    assert (d.replica, d.reason, d.matched_blocks) == ("b", "imbalanced", 0)
    # 9 - 5 = 4 is not above the absolute threshold: the cache decides.
    d = choose_replica({"a": 9, "b": 5}, {"a": 8}, num_blocks=8, config=config)
    assert (d.replica, d.reason) == ("a", "prefix")
    # 20 - 14 > 4 but 20 < 1.5 * 14: not imbalanced either.
    d = choose_replica({"a": 20, "b": 14}, {"a": 8}, num_blocks=8, config=config)
    assert d.reason == "prefix"


def test_low_match_ratio_falls_back_to_power_of_two() -> None:
    config = RoutingConfig(balance_abs_threshold=4, match_threshold=0.5)
    queues = {"a": 3, "b": 1, "c": 2, "d": 0}
    for seed in range(20):
        rng = random.Random(seed)
        d = choose_replica(queues, {"a": 3}, num_blocks=8, config=config, rng=rng)
        assert d.reason == "power_of_two"
        pair = random.Random(seed).sample(list(queues), 2)
        assert d.replica == min(pair, key=lambda r: queues[r])
    # No full block: power of two choices too.
    d = choose_replica({"a": 0, "b": 2}, {}, num_blocks=0, rng=random.Random(0))
    assert (d.replica, d.reason) == ("a", "power_of_two")


def test_bad_config_and_no_replica() -> None:
    with pytest.raises(ValueError, match="match_threshold"):
        RoutingConfig(match_threshold=1.5)
    with pytest.raises(ValueError, match="balance_rel_threshold"):
        RoutingConfig(balance_rel_threshold=0.5)
    with pytest.raises(ValueError, match="no replica"):
        choose_replica({}, {}, num_blocks=1)


def _wait_for(predicate, timeout: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_subscriber_follows_an_engine_and_replays(tiny_model_dir: Path, tmp_path: Path) -> None:
    block = 8
    pub, replay = f"ipc://{tmp_path}/pub", f"ipc://{tmp_path}/replay"
    config = {
        "enable_kv_cache_events": True,
        "endpoint": pub,
        "replay_endpoint": replay,
        "topic": "kv",
    }
    llm = LLM(
        str(tiny_model_dir),
        device="cpu",
        block_size=block,
        max_model_len=64,
        num_gpu_blocks_override=12,
        kv_events_config=json.dumps(config),
        data_parallel_rank=3,
    )
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    prompts = [[100 * (i + 1) + t for t in range(20)] for i in range(2)]
    index: PrefixCacheIndex[str] = PrefixCacheIndex(expect_ttl_s=0)
    ctx = zmq.Context()
    raw = ctx.socket(zmq.SUB)
    raw.setsockopt(zmq.SUBSCRIBE, b"kv")
    raw.connect(pub)
    subscriber = None
    try:
        # Before anyone subscribed: only the replay can tell.
        llm.generate([{"prompt_token_ids": prompts[0]}], params, use_tqdm=False)
        subscriber = KVEventSubscriber(index, "kv")
        subscriber.add("r3", pub, replay)
        first = _core.block_hashes(prompts[0], block)
        assert _wait_for(lambda: index.matched_blocks(first, ["r3"])["r3"] == 2)
        time.sleep(0.3)  # the live subscription reaches the PUB socket
        llm.generate([{"prompt_token_ids": prompts[1]}], params, use_tqdm=False)
        second = _core.block_hashes(prompts[1], block)
        assert _wait_for(lambda: index.matched_blocks(second, ["r3"])["r3"] == 2)
        assert raw.poll(5000)
        _, _, payload = raw.recv_multipart()
        batch = msgspec.msgpack.decode(payload, type=KVEventBatch)
        assert batch.data_parallel_rank == 3
        # Distinct long prompts evict the first ones: the index follows.
        for i in range(2, 6):
            llm.generate([{"prompt_token_ids": [7 * i + t for t in range(40)]}], params)
        cached = llm.kv_cache_stats()["num_cached_blocks"]
        assert _wait_for(lambda: index.num_blocks("r3") == cached)
        assert index.matched_blocks(first, ["r3"])["r3"] == 0
        subscriber.remove("r3")
        assert _wait_for(lambda: index.num_blocks("r3") == 0)
    finally:
        if subscriber is not None:
            subscriber.close()
        raw.close(linger=0)
        ctx.term()
        llm.shutdown()


def test_routing_imports_neither_torch_nor_transformers() -> None:
    code = (
        "import sys, pagedrs.serve.routing, pagedrs.kv_events; "
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stderr
