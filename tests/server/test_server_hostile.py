"""One hostile client cannot stall the others: a body over the bound gets 413
unread, a prompt too long by its characters is refused before tokenizing, and
tokenizing runs off the event loop, so small requests sent meanwhile are served at
about their unloaded latency; the server goes on with every block free."""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pagedrs import EngineArgs
from pagedrs.engine.async_llm import AsyncLLM
from pagedrs.entrypoints.openai import tokenization
from pagedrs.entrypoints.openai.api_server import build_app
from pagedrs.entrypoints.openai.cli_args import DEFAULT_MAX_REQUEST_BODY_BYTES, add_serve_args
from server_utils import ServerThread, all_blocks_free, torch_threads, wait_for

CMPL = "/v1/completions"
CHAT = "/v1/chat/completions"
JSON = {"Content-Type": "application/json"}
SMALL = {"model": "tiny", "prompt": "Hello", "max_tokens": 4, "temperature": 0}
SENTENCE = "The quick brown fox jumps over the lazy dog. "
LIMIT = DEFAULT_MAX_REQUEST_BODY_BYTES
# Loaded latency may be this many times the unloaded one, plus the slack (seconds):
# generous, since the machine is shared and noisy.
FACTOR, SLACK_S = 5.0, 1.0


def _serve(model_dir: Path) -> tuple[AsyncLLM, Any]:
    """The server's default: the engine core in its own process."""
    engine = AsyncLLM(EngineArgs(model=str(model_dir), max_model_len=256), torch_threads=1)
    return engine, build_app(engine, ["tiny"])


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path) -> Iterator[ServerThread]:
    _, app = _serve(tiny_model_dir)
    with torch_threads(1), ServerThread(app) as srv:
        yield srv


def _error(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["type"] == "invalid_request_error"
    return body["error"]


def _prompt_body(size: int) -> bytes:
    """A completion request of exactly ``size`` bytes."""
    empty = json.dumps({"model": "tiny", "prompt": "", "max_tokens": 4}).encode()
    return json.dumps(
        {"model": "tiny", "prompt": "x" * (size - len(empty)), "max_tokens": 4}
    ).encode()


def _unloaded_latency(client: httpx.Client) -> float:
    client.post(CMPL, json=SMALL)  # warm
    times = []
    for _ in range(3):
        t = time.monotonic()
        assert client.post(CMPL, json=SMALL).status_code == 200
        times.append(time.monotonic() - t)
    return statistics.median(times)


async def _small_requests_during(base_url: str, path: str, body: bytes) -> tuple[Any, list[float]]:
    """Send ``body`` to ``path`` and, until it is answered, small requests one after
    another. Returns (its response, the small requests' latencies)."""
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:
        big = asyncio.ensure_future(client.post(path, content=body, headers=JSON))
        await asyncio.sleep(0.01)
        latencies = []
        while True:
            t = time.monotonic()
            r = await client.post(CMPL, json=SMALL)
            assert r.status_code == 200, r.text
            latencies.append(time.monotonic() - t)
            if big.done():
                return big.result(), latencies


def test_serve_flag() -> None:
    import argparse

    parser = add_serve_args(argparse.ArgumentParser())
    assert parser.parse_args([]).max_request_body_bytes == LIMIT == 16 * 1024 * 1024
    assert parser.parse_args(["--max-request-body-bytes", "1000"]).max_request_body_bytes == 1000
    with pytest.raises(SystemExit):
        parser.parse_args(["--max-request-body-bytes", "0"])


def test_oversized_body_is_413(server: ServerThread) -> None:
    over = _prompt_body(LIMIT + 1)
    with httpx.Client(base_url=server.url, timeout=60) as client:
        # Refused from Content-Length; the same connection serves the next request.
        err = _error(client.post(CMPL, content=over, headers=JSON), 413)
        assert err["code"] == "request_too_large" and str(LIMIT) in err["message"]

        def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
            for i in range(0, len(over), 1 << 20):
                yield over[i : i + (1 << 20)]

        r = client.post(CHAT, content=chunks(), headers=JSON)
        assert r.request.headers["transfer-encoding"] == "chunked"
        assert _error(r, 413)["code"] == "request_too_large"
        # Exactly the limit is read, and refused for its prompt (by its characters).
        err = _error(client.post(CMPL, content=_prompt_body(LIMIT), headers=JSON), 400)
        assert err["code"] == "context_length_exceeded"
        assert client.post(CMPL, json=SMALL).status_code == 200
    wait_for(lambda: all_blocks_free(server.url), what="all blocks free")


@pytest.mark.parametrize("kind", ["text", "chat", "token ids"])
def test_huge_prompt_is_refused_quickly_and_others_go_on(server: ServerThread, kind: str) -> None:
    text = SENTENCE * (10_000_000 // len(SENTENCE))  # 10 MB
    path = CHAT if kind == "chat" else CMPL
    if kind == "text":
        body = json.dumps({"model": "tiny", "prompt": text, "max_tokens": 4})
    elif kind == "chat":
        body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": text}]})
    else:  # 4 MB: parsing and validating JSON holds the event loop, ~0.1 s a MB
        body = json.dumps({"model": "tiny", "prompt": [1] * 2_000_000, "max_tokens": 4})
    with httpx.Client(base_url=server.url, timeout=60) as client:
        unloaded = _unloaded_latency(client)
    t = time.monotonic()
    r, latencies = asyncio.run(_small_requests_during(server.url, path, body.encode()))
    elapsed = time.monotonic() - t
    err = _error(r, 400)
    assert err["code"] == "context_length_exceeded"
    assert err["param"] == ("prompt" if path == CMPL else "messages")
    assert ("tokens:" if kind == "token ids" else "characters") in err["message"]
    # Tokenizing the text took ~17 s before the character check.
    assert elapsed < 10.0, f"the huge prompt took {elapsed:.1f}s to refuse"
    assert max(latencies) < FACTOR * unloaded + SLACK_S, (unloaded, latencies)
    wait_for(lambda: all_blocks_free(server.url), what="all blocks free")


def test_tokenizing_does_not_hold_the_loop(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the character bound (a tokenizer that gives none), a long prompt is
    tokenized in full, on a worker thread: small requests go on meanwhile, and the
    prompt is then refused by its token count."""
    monkeypatch.setattr(tokenization, "max_chars_per_token", lambda tok: None)
    _, app = _serve(tiny_model_dir)
    text = SENTENCE * (1_000_000 // len(SENTENCE))  # 1 MB: ~1.3 s of tokenizing
    body = json.dumps({"model": "tiny", "prompt": text, "max_tokens": 4}).encode()
    with torch_threads(1), ServerThread(app) as srv:
        with httpx.Client(base_url=srv.url, timeout=60) as client:
            unloaded = _unloaded_latency(client)
        r, latencies = asyncio.run(_small_requests_during(srv.url, CMPL, body))
        err = _error(r, 400)
        assert err["code"] == "context_length_exceeded" and "tokens" in err["message"]
        assert max(latencies) < FACTOR * unloaded + SLACK_S, (unloaded, latencies)
        assert len(latencies) >= 2, latencies  # some were served while it was tokenized
        wait_for(lambda: all_blocks_free(srv.url), what="all blocks free")
