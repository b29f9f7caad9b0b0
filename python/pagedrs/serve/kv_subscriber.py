"""Subscribing to the replicas' KV events and applying them to a
:class:`~pagedrs.serve.routing.PrefixCacheIndex`.

One thread owns every ZeroMQ socket (sockets are not thread-safe): a SUB socket
per replica on its publisher (:mod:`pagedrs.kv_events`) and, on
joining and whenever a sequence number is skipped, a DEALER on the replica's
replay socket that fetches the missed batches first, so a router that joins
late or drops messages still learns every block a replica holds.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import msgspec
import zmq

from ..kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch
from .routing import PrefixCacheIndex

logger = logging.getLogger(__name__)

__all__ = ["KVEventSubscriber"]

_REPLAY_TIMEOUT_MS = 2000


@dataclass
class _Source:
    replica: Hashable
    sub: zmq.Socket[bytes]
    replay_endpoint: str | None
    last_seq: int = -1


class KVEventSubscriber:
    """Keeps ``index`` up to date from the replicas' KV event publishers.

    Args:
        index: the index events are applied to (keys: the replicas passed to
            :meth:`add`).
        topic: the publishers' topic (``KVEventsConfig.topic``).
    """

    def __init__(self, index: PrefixCacheIndex[Any], topic: str = "") -> None:
        self.index = index
        self.topic = topic.encode()
        self._decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
        self._commands: queue.SimpleQueue[tuple[str, Hashable, str | None, str | None]] = (
            queue.SimpleQueue()
        )
        self._ctx = zmq.Context()
        self._sources: dict[Hashable, _Source] = {}
        self._stopped = threading.Event()
        self.num_batches = 0
        self._thread = threading.Thread(target=self._run, name="kv-subscriber", daemon=True)
        self._thread.start()

    def add(self, replica: Hashable, endpoint: str, replay_endpoint: str | None = None) -> None:
        """Subscribe to ``replica``'s publisher at ``endpoint`` (a connectable
        address such as ``tcp://10.0.0.5:5557``), first replaying what it sent
        already when ``replay_endpoint`` is given."""
        self._commands.put(("add", replica, endpoint, replay_endpoint))

    def remove(self, replica: Hashable) -> None:
        """Unsubscribe from ``replica`` and forget its blocks."""
        self._commands.put(("remove", replica, None, None))

    def close(self) -> None:
        """Stop the thread and close the sockets (idempotent)."""
        self._stopped.set()
        self._thread.join(timeout=5.0)

    # ------------------------------------------------------------ the thread

    def _run(self) -> None:
        poller = zmq.Poller()
        try:
            while not self._stopped.is_set():
                self._apply_commands(poller)
                for sock, _ in poller.poll(50):
                    source = next(s for s in self._sources.values() if s.sub is sock)
                    self._drain(source)
        except Exception:
            logger.exception("KV event subscriber stopped")
        finally:
            for s in self._sources.values():
                s.sub.close(linger=0)
            self._ctx.term()

    def _apply_commands(self, poller: zmq.Poller) -> None:
        while True:
            try:
                kind, replica, endpoint, replay = self._commands.get_nowait()
            except queue.Empty:
                return
            old = self._sources.pop(replica, None)
            if old is not None:
                poller.unregister(old.sub)
                old.sub.close(linger=0)
                self.index.cleared(replica)
            if kind == "remove":
                continue
            assert endpoint is not None
            sub = self._ctx.socket(zmq.SUB)
            sub.setsockopt(zmq.SUBSCRIBE, self.topic)
            sub.connect(endpoint)
            source = _Source(replica, sub, replay)
            self._sources[replica] = source
            poller.register(sub, zmq.POLLIN)
            self._replay(source, 0)

    def _drain(self, source: _Source) -> None:
        while True:
            try:
                _, seq_frame, payload = source.sub.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            seq = int.from_bytes(seq_frame, "big")
            if seq <= source.last_seq:
                continue  # already applied from a replay
            if seq > source.last_seq + 1 and source.replay_endpoint is not None:
                self._replay(source, source.last_seq + 1)
                if seq <= source.last_seq:
                    continue
            self._apply(source, seq, payload)

    def _replay(self, source: _Source, start: int) -> None:
        """Fetch and apply the buffered batches from ``start`` on."""
        if source.replay_endpoint is None:
            return
        dealer = self._ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        try:
            dealer.connect(source.replay_endpoint)
            dealer.send_multipart((b"", start.to_bytes(8, "big")))
            while dealer.poll(_REPLAY_TIMEOUT_MS):
                _, seq_frame, payload = dealer.recv_multipart()
                if not payload:
                    return  # end of replay
                seq = int.from_bytes(seq_frame, "big")
                if seq > source.last_seq:
                    self._apply(source, seq, payload)
            logger.warning("KV event replay from %s timed out", source.replay_endpoint)
        finally:
            dealer.close(linger=0)

    def _apply(self, source: _Source, seq: int, payload: bytes) -> None:
        source.last_seq = seq
        try:
            batch = self._decoder.decode(payload)
        except msgspec.DecodeError:
            logger.warning("undecodable KV event batch %d from %r", seq, source.replica)
            return
        self.num_batches += 1
        for event in batch.events:
            if isinstance(event, BlockStored):
                self.index.stored(source.replica, event.block_hashes)
            elif isinstance(event, BlockRemoved):
                self.index.removed(source.replica, event.block_hashes)
            elif isinstance(event, AllBlocksCleared):
                self.index.cleared(source.replica)
