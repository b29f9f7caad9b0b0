"""Helpers of the server tests: a uvicorn server in a thread on a loopback port,
and Prometheus metrics read back as numbers."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import torch
import uvicorn
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run torch with ``n`` intra-op threads inside the block. A server in the
    test process shares the 2 cores with its event loop and its clients; one
    torch thread avoids oversubscribing them (OpenMP spin-waits)."""
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


class ServerThread:
    """Serve ``app`` with uvicorn in a daemon thread on 127.0.0.1 and a free port.

    Args:
        app: the ASGI app (its lifespan runs: shutdown stops its engine).
    """

    def __init__(self, app: FastAPI) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    @property
    def url(self) -> str:
        """Base URL, without ``/v1``."""
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()


def metrics(base_url: str) -> dict[str, float]:
    """``/metrics`` as ``{sample name{labels}: value}``; labels other than
    ``model_name`` are kept in the key, e.g. ``pagedrs:request_success_total{abort}``."""
    text = httpx.get(f"{base_url}/metrics", timeout=10).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            extra = [v for k, v in sorted(s.labels.items()) if k not in ("model_name", "le")]
            key = s.name + (f"{{{','.join(extra)}}}" if extra else "")
            if "le" not in s.labels:
                out[key] = s.value
    return out


def wait_for(cond: Callable[[], bool], timeout: float = 20.0, what: str = "condition") -> None:
    """Poll ``cond`` every 50 ms until true.

    Raises:
        AssertionError: still false after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def all_blocks_free(base_url: str) -> bool:
    """True when /metrics shows every KV block free and no request in flight."""
    m = metrics(base_url)
    return (
        m["pagedrs:num_free_blocks"] == m["pagedrs:num_total_blocks"]
        and m["pagedrs:num_requests_running"] == 0
        and m["pagedrs:num_requests_waiting"] == 0
    )
