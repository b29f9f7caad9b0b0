"""KV cache events in vLLM's wire format, published over ZeroMQ for routers.

The Rust scheduler records every change to the device pool's prefix cache
(``Scheduler.take_kv_events``); after each engine step ``EngineCore`` hands the
step's events to a :class:`ZmqEventPublisher`, which sends them as one
:class:`KVEventBatch` (msgpack, ``msgspec`` tagged array-like structs, the
field order of vLLM's ``vllm/distributed/kv_events.py``).

Wire format, one PUB message per step with events, three frames:
``topic`` (UTF-8, ``KVEventsConfig.topic``), the sequence number (8 bytes,
big-endian, 0 first, one more per message) and the payload, the batch as the
array ``[ts, events]`` (``ts``: ``time.time()`` seconds; a third element,
``data_parallel_rank``, only when set), each event a tagged array:

- ``["BlockStored", block_hashes, parent_block_hash, token_ids, block_size,
  lora_id, medium]``
- ``["BlockRemoved", block_hashes, medium]``
- ``["AllBlocksCleared"]``

Block hashes are the engine's 32-byte SHA-256 chained hashes (msgpack ``bin``),
the values ``pagedrs._core.block_hashes(token_ids, block_size, cache_salt,
lora_id)`` returns, equal across processes and machines. ``lora_id`` is the
stored blocks' LoRA adapter (``lora_int_id``), None for the base model.
``medium`` is "GPU" for the device pool on a CUDA device and "CPU" for the pool
of an engine running on the CPU (the swap pool caches no prefixes and sends
nothing). A model with several KV cache groups (sliding-window layers) sends
one event per group for the same hashes.

Replay: with ``replay_endpoint`` set, a ROUTER socket answers a request whose
last frame is a start sequence number (8 bytes, big-endian) with one message
``[b"", seq, payload]`` per buffered message from that number on (the last
``buffer_steps`` messages), then ``[b"", -1 (8 bytes, signed), b""]``. A
DEALER client sends ``[b"", start]`` and reads until the empty payload (a REQ
socket reads only the first reply of a request).
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, fields
from typing import Any, Protocol

import msgspec
import zmq

import pagedrs._core as _core

logger = logging.getLogger(__name__)

__all__ = [
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "EventPublisher",
    "KVEventBatch",
    "KVEventsConfig",
    "ZmqEventPublisher",
    "make_publisher",
    "to_wire",
]

PUBLISHERS: tuple[str, ...] = ("zmq", "null")
_END_OF_REPLAY = (-1).to_bytes(8, "big", signed=True)


@dataclass(frozen=True)
class KVEventsConfig:
    """KV event publishing, as vLLM's ``KVEventsConfig``.

    Attributes:
        enable_kv_cache_events: record and publish prefix-cache events.
        publisher: "zmq" (a ZeroMQ PUB socket) or "null" (record nothing).
        endpoint: where the PUB socket binds (``tcp://*:5557``, ``ipc:///path``).
        replay_endpoint: where the replay ROUTER socket binds; None: no replay.
        buffer_steps: messages kept for replay (the newest ones).
        hwm: the PUB socket's send high-water mark, messages (ZeroMQ drops
            messages to a subscriber beyond it).
        topic: the first frame of every message (subscribers filter on it).
    """

    enable_kv_cache_events: bool = False
    publisher: str = "zmq"
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    topic: str = ""

    def __post_init__(self) -> None:
        if self.publisher not in PUBLISHERS:
            raise ValueError(f"kv_events_config.publisher must be one of {PUBLISHERS}")
        for name in ("buffer_steps", "hwm"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"kv_events_config.{name} must be a positive integer, got {v!r}")
        if not isinstance(self.enable_kv_cache_events, bool):
            raise ValueError("kv_events_config.enable_kv_cache_events must be a boolean")
        for name in ("endpoint", "topic", "replay_endpoint"):
            v = getattr(self, name)
            if not isinstance(v, str) and not (name == "replay_endpoint" and v is None):
                raise ValueError(f"kv_events_config.{name} must be a string, got {v!r}")

    @property
    def active(self) -> bool:
        """Whether the engine records and publishes events."""
        return self.enable_kv_cache_events and self.publisher != "null"

    @classmethod
    def from_json(cls, text: str) -> KVEventsConfig:
        """Parse ``--kv-events-config``: a JSON object of these fields.

        Raises:
            ValueError: not JSON, not an object, an unknown key or a bad value.
        """
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"kv_events_config is not valid JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise ValueError("kv_events_config must be a JSON object")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"kv_events_config: unknown keys {unknown}; known: {sorted(known)}")
        return cls(**data)


# ------------------------------------------------------------- wire structs


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """A step's events: ``ts`` (``time.time()`` seconds) and the events."""

    ts: float
    events: list[Any]


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    """A prefix-cache event; encoded as ``[class name, *fields]``."""


class BlockStored(KVCacheEvent):
    """Full blocks became cached: hashes in chain order after
    ``parent_block_hash`` (None: a sequence's first block), their
    ``token_ids`` (``block_size`` per block)."""

    block_hashes: list[bytes]
    parent_block_hash: bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class BlockRemoved(KVCacheEvent):
    """Cached blocks were evicted from ``medium``."""

    block_hashes: list[bytes]
    medium: str | None


class AllBlocksCleared(KVCacheEvent):
    """Every cached block was dropped (``LLM.reset_prefix_cache``)."""


class KVEventBatch(EventBatch):
    """What one PUB message carries; ``data_parallel_rank`` is omitted when None."""

    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
    data_parallel_rank: int | None = None


def to_wire(
    event: _core.KVCacheEvent, medium: str
) -> BlockStored | BlockRemoved | AllBlocksCleared:
    """The wire struct of one Rust event, ``medium`` "GPU" or "CPU".

    Raises:
        ValueError: an unknown event kind.
    """
    if event.kind == "stored":
        return BlockStored(
            block_hashes=event.block_hashes,
            parent_block_hash=event.parent_block_hash,
            token_ids=event.token_ids,
            block_size=event.block_size,
            lora_id=event.lora_id,
            medium=medium,
        )
    if event.kind == "removed":
        return BlockRemoved(block_hashes=event.block_hashes, medium=medium)
    if event.kind == "all_cleared":
        return AllBlocksCleared()
    raise ValueError(f"unknown KV cache event kind {event.kind!r}")


# ------------------------------------------------------------- publishers


class EventPublisher(Protocol):
    """Takes each step's events; ``close`` is idempotent."""

    def publish(self, events: list[_core.KVCacheEvent]) -> None: ...
    def close(self) -> None: ...


class ZmqEventPublisher:
    """Publishes event batches on a ZeroMQ PUB socket from a thread of its own.

    ``publish`` (the engine's step loop) encodes a batch and queues it; the
    thread numbers it, sends it and keeps it for replay, and answers replay
    requests between sends, so a slow subscriber never stalls a step.

    Args:
        config: endpoints, topic, buffer and high-water mark.
        medium: "GPU" or "CPU", the device pool's medium.
        data_parallel_rank: this engine's rank among replicas, or None.
    Raises:
        zmq.ZMQError: an endpoint cannot be bound (in use, bad address).
    """

    def __init__(
        self, config: KVEventsConfig, medium: str, data_parallel_rank: int | None = None
    ) -> None:
        self.config, self.medium, self.rank = config, medium, data_parallel_rank
        self._encoder = msgspec.msgpack.Encoder()
        self._queue: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._ctx = zmq.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.SNDHWM, config.hwm)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._replay: zmq.Socket[bytes] | None = None
        try:
            self._pub.bind(config.endpoint)
            if config.replay_endpoint is not None:
                self._replay = self._ctx.socket(zmq.ROUTER)
                self._replay.setsockopt(zmq.LINGER, 0)
                self._replay.bind(config.replay_endpoint)
        except zmq.ZMQError:
            self._close_sockets()
            raise
        self._topic = config.topic.encode()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._next_seq = 0
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self._thread.start()

    def publish(self, events: list[_core.KVCacheEvent]) -> None:
        """Queue one step's events as a ``KVEventBatch`` (nothing when empty
        or closed)."""
        if not events or self._closed:
            return
        batch = KVEventBatch(
            ts=time.time(),
            events=[to_wire(e, self.medium) for e in events],
            data_parallel_rank=self.rank,
        )
        self._queue.put(self._encoder.encode(batch))

    def close(self) -> None:
        """Send what is queued, stop the thread and close the sockets."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)
        self._thread.join(timeout=5.0)

    def _run(self) -> None:
        """The thread: send queued batches, answer replay requests."""
        poller = zmq.Poller()
        if self._replay is not None:
            poller.register(self._replay, zmq.POLLIN)
        try:
            while True:
                try:
                    payload = self._queue.get(timeout=0.05)
                except queue.Empty:
                    payload = b""
                if payload is None:
                    break
                if payload:
                    self._send(payload)
                if self._replay is not None and poller.poll(0):
                    self._answer_replay()
        except Exception:  # the engine goes on without events
            logger.exception("KV event publisher stopped")
        finally:
            self._close_sockets()

    def _send(self, payload: bytes) -> None:
        seq = self._next_seq
        self._next_seq += 1
        self._buffer.append((seq, payload))
        self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))

    def _answer_replay(self) -> None:
        """Answer every pending replay request: ``[identity, b"", start]``."""
        assert self._replay is not None
        while True:
            try:
                frames = self._replay.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            identity, start_frame = frames[0], frames[-1]
            start = int.from_bytes(start_frame, "big") if len(start_frame) == 8 else 0
            for seq, payload in self._buffer:
                if seq >= start:
                    self._replay.send_multipart((identity, b"", seq.to_bytes(8, "big"), payload))
            self._replay.send_multipart((identity, b"", _END_OF_REPLAY, b""))

    def _close_sockets(self) -> None:
        self._pub.close(linger=500)  # ms to flush what subscribers have not taken
        if self._replay is not None:
            self._replay.close(linger=0)
        self._ctx.term()


def device_medium(device_type: str) -> str:
    """The ``medium`` of the device pool: "GPU" on CUDA, "CPU" otherwise."""
    return "GPU" if device_type == "cuda" else "CPU"


def make_publisher(
    config: KVEventsConfig | None, device_type: str, data_parallel_rank: int | None = None
) -> EventPublisher | None:
    """The publisher ``config`` asks for, or None when events are off.

    Raises:
        zmq.ZMQError: an endpoint cannot be bound.
    """
    if config is None or not config.active:
        return None
    return ZmqEventPublisher(config, device_medium(device_type), data_parallel_rank)
