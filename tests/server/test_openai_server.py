"""The official ``openai`` client against the server on a loopback port:
completions and chat, streamed and not, n, stop strings, logprobs, usage; and
``pagedrs serve`` with the default model."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from pagedrs import LLM, EngineArgs, SamplingParams
from pagedrs.engine.async_llm import AsyncLLM
from pagedrs.entrypoints.openai.api_server import build_app
from reference import PROMPTS
from server_utils import ServerThread, all_blocks_free, metrics, torch_threads, wait_for

API_KEY = "test-key"
MODEL = "tiny"
CHAT = [{"role": "user", "content": "Name three rivers."}]


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path) -> Iterator[ServerThread]:
    engine = AsyncLLM(EngineArgs(model=str(tiny_model_dir), max_model_len=256), torch_threads=1)
    app = build_app(engine, [MODEL, "tiny-alias"], api_key=API_KEY, root_model="tiny-llama")
    with torch_threads(1), ServerThread(app) as srv:
        yield srv
    assert not engine.is_running  # the app's shutdown stopped the engine


@pytest.fixture(scope="module")
def client(server: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=60)


def _stream_text(chunks: list, n: int = 1) -> list[str]:
    texts = [""] * n
    for ch in chunks:
        for c in ch.choices:
            piece = c.text if hasattr(c, "text") else (c.delta.content or "")
            texts[c.index] += piece
    return texts


def test_models_health_metrics(server: ServerThread, client: openai.OpenAI) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL, "tiny-alias"]
    assert httpx.get(f"{server.url}/health").status_code == 200
    m = metrics(server.url)
    for name in (
        "pagedrs:num_requests_running",
        "pagedrs:num_requests_waiting",
        "pagedrs:num_requests_swapped",
        "pagedrs:kv_cache_usage_perc",
        "pagedrs:kv_cache_utilization",
        "pagedrs:num_free_blocks",
        "pagedrs:num_total_blocks",
        "pagedrs:prefix_cache_hit_rate",
        "pagedrs:num_preemptions_total",
        "pagedrs:kv_cache_group_used_blocks{0,none}",  # one full-attention group
        "pagedrs:kv_cache_group_utilization{0,none}",
    ):
        assert name in m


def test_completion_stream_equals_non_stream(client: openai.OpenAI, tiny_model_dir: Path) -> None:
    prompts = PROMPTS[:3]
    for prompt in prompts:
        full = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0)
        chunks = list(
            client.completions.create(
                model=MODEL,
                prompt=prompt,
                max_tokens=24,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        assert _stream_text(chunks[:-1]) == [full.choices[0].text]
        assert chunks[-2].choices[0].finish_reason == full.choices[0].finish_reason
        assert chunks[-1].choices == [] and chunks[-1].usage == full.usage
        assert full.usage.completion_tokens <= 24
        assert full.usage.total_tokens == full.usage.prompt_tokens + full.usage.completion_tokens
    # the same text as the offline API, with the same token counts
    ref = LLM(str(tiny_model_dir), max_model_len=256).generate(
        prompts[0], SamplingParams(max_tokens=24, temperature=0.0), use_tqdm=False
    )[0]
    again = client.completions.create(
        model="tiny-alias", prompt=prompts[0], max_tokens=24, temperature=0
    )
    assert again.choices[0].text == ref.outputs[0].text
    assert again.usage.prompt_tokens == len(ref.prompt_token_ids)
    assert again.usage.completion_tokens == len(ref.outputs[0].token_ids)


def test_chat_stream_equals_non_stream(client: openai.OpenAI) -> None:
    full = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_completion_tokens=20, temperature=0
    )
    assert full.choices[0].message.role == "assistant"
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=CHAT,
            max_tokens=20,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert _stream_text(chunks) == [full.choices[0].message.content]
    assert chunks[-2].choices[0].finish_reason == full.choices[0].finish_reason == "length"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 20
    assert full.usage.completion_tokens == 20


def test_parallel_sampling_n2(client: openai.OpenAI) -> None:
    kw = {"model": MODEL, "max_tokens": 12, "temperature": 1.0, "seed": 7, "n": 2}
    full = client.completions.create(prompt="Once upon a time", **kw)
    assert sorted(c.index for c in full.choices) == [0, 1]
    texts = [c.text for c in sorted(full.choices, key=lambda c: c.index)]
    assert texts[0] != texts[1]
    chunks = list(client.completions.create(prompt="Once upon a time", stream=True, **kw))
    assert _stream_text(chunks, 2) == texts  # a seed reproduces whatever the mode
    chat = client.chat.completions.create(messages=CHAT, extra_body={"ignore_eos": True}, **kw)
    assert sorted(c.index for c in chat.choices) == [0, 1]
    assert chat.usage.completion_tokens == 2 * 12
    chat_chunks = list(
        client.chat.completions.create(
            messages=CHAT, stream=True, extra_body={"ignore_eos": True}, **kw
        )
    )
    assert _stream_text(chat_chunks, 2) == [
        c.message.content for c in sorted(chat.choices, key=lambda c: c.index)
    ]


def test_stop_strings(client: openai.OpenAI) -> None:
    kw = {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 40, "temperature": 0}
    text = client.completions.create(**kw).choices[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    expected = text[: text.find(stop)]
    out = client.completions.create(stop=[stop, "never-there"], **kw)
    assert out.choices[0].text == expected
    assert out.choices[0].finish_reason == "stop"
    chunks = list(client.completions.create(stop=stop, stream=True, **kw))
    assert _stream_text(chunks) == [expected]
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_completion_logprobs(client: openai.OpenAI) -> None:
    kw = {"model": MODEL, "prompt": "def fib(n):", "max_tokens": 10, "temperature": 0}
    out = client.completions.create(logprobs=3, **kw)
    lp = out.choices[0].logprobs
    assert lp is not None and len(lp.tokens) == out.usage.completion_tokens == 10
    assert len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 10
    for chosen, top in zip(lp.token_logprobs, lp.top_logprobs, strict=True):
        assert 1 <= len(top) <= 4 and chosen <= 0
        assert chosen == pytest.approx(max(top.values()), abs=1e-5)  # greedy picks the top
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    chunks = list(client.completions.create(logprobs=3, stream=True, **kw))
    streamed = [t for ch in chunks if ch.choices[0].logprobs for t in ch.choices[0].logprobs.tokens]
    assert streamed == lp.tokens


def test_chat_logprobs(client: openai.OpenAI) -> None:
    kw = {"model": MODEL, "messages": CHAT, "max_tokens": 8, "temperature": 0}
    out = client.chat.completions.create(logprobs=True, top_logprobs=2, **kw)
    content = out.choices[0].logprobs.content
    assert len(content) == 8
    for tok in content:
        assert len(tok.top_logprobs) == 2
        assert tok.top_logprobs[0].logprob >= tok.top_logprobs[1].logprob
        assert tok.logprob == pytest.approx(tok.top_logprobs[0].logprob, abs=1e-5)
        assert tok.bytes == list(tok.token.encode())
    plain = client.chat.completions.create(logprobs=True, **kw).choices[0].logprobs.content
    assert [t.token for t in plain] == [t.token for t in content]
    assert all(t.top_logprobs == [] for t in plain)
    assert client.chat.completions.create(**kw).choices[0].logprobs is None
    chunks = list(client.chat.completions.create(logprobs=True, top_logprobs=2, stream=True, **kw))
    streamed = [
        t.token for c in chunks for ch in c.choices if ch.logprobs for t in ch.logprobs.content
    ]
    assert streamed == [t.token for t in content]


def test_multiple_prompts_and_token_prompts(client: openai.OpenAI) -> None:
    kw = {"model": MODEL, "max_tokens": 6, "temperature": 0}
    both = client.completions.create(prompt=["Hi", "def fib(n):"], **kw)
    assert [c.index for c in sorted(both.choices, key=lambda c: c.index)] == [0, 1]
    one = client.completions.create(prompt="def fib(n):", **kw)
    assert sorted(both.choices, key=lambda c: c.index)[1].text == one.choices[0].text
    tok_prompt = client.completions.create(prompt=[1, 2, 3, 4], echo=False, **kw)
    assert tok_prompt.usage.prompt_tokens == 4
    echoed = client.completions.create(prompt="def fib(n):", echo=True, **kw)
    assert echoed.choices[0].text == "def fib(n):" + one.choices[0].text


def test_wrong_api_key(server: ServerThread) -> None:
    bad = openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        bad.models.list()
    assert e.value.status_code == 401
    wait_for(lambda: all_blocks_free(server.url), what="all blocks free")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_cli_with_default_model(default_model_dir: Path) -> None:
    """``pagedrs serve`` in a subprocess: a realistic chat stream, equal to the
    non-streamed reply, and a clean exit on SIGTERM."""
    port = _free_port()
    cmd = [
        sys.executable, "-m", "pagedrs.cli", "serve", "smollm2-135m-instruct",
        "--port", str(port), "--max-model-len", "1024", "--served-model-name", "smol",
        "--log-level", "warning", "--torch-threads", "1",
        # The exact option: HF's greedy reply ("Paris"); int8 activations, the GGUF
        # default, give llama.cpp's own reply on this file, which is not.
        "--activation-quantization", "int16",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, env=dict(os.environ), stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "server did not come up"
            time.sleep(0.3)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)
        msgs = [{"role": "user", "content": "What is the capital of France?"}]
        full = client.chat.completions.create(
            model="smol", messages=msgs, max_tokens=24, temperature=0
        )
        text = full.choices[0].message.content
        assert "Paris" in text
        pieces = [
            c.choices[0].delta.content or ""
            for c in client.chat.completions.create(
                model="smol", messages=msgs, max_tokens=24, temperature=0, stream=True
            )
            if c.choices
        ]
        assert len([p for p in pieces if p]) > 3  # really streamed, piece by piece
        assert "".join(pieces) == text
        wait_for(lambda: all_blocks_free(url), what="all blocks free")
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode in (0, -15)


def test_metrics_under_vllm_names(server: ServerThread, client: openai.OpenAI) -> None:
    from pagedrs.entrypoints.openai.metrics import VLLM_NAMES
    from prometheus_client.parser import text_string_to_metric_families

    client.completions.create(model="tiny", prompt="Hello", max_tokens=3)
    text = httpx.get(f"{server.url}/metrics").text
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    shared = {k for k in samples if k[0].startswith("vllm:")}
    names = {k[0].split(":", 1)[1] for k in shared}
    assert {n.removesuffix("_total") for n in names} >= {
        "num_requests_running",
        "kv_cache_usage_perc",
        "prefix_cache_queries",
        "prefix_cache_hits",
        "time_to_first_token_seconds_count",
        "request_queue_time_seconds_count",
        "request_prefill_time_seconds_count",
        "prompt_tokens",
    }
    suffixes = ("_total", "_count", "_sum", "_bucket", "_created")
    for n in names:
        base = next((n.removesuffix(x) for x in suffixes if n.endswith(x)), n)
        assert base in VLLM_NAMES, n
    for name, labels in shared:
        if not name.endswith("_created"):  # creation times differ by microseconds
            twin = ("pagedrs:" + name.split(":", 1)[1], labels)
            assert samples[twin] == samples[(name, labels)], name
