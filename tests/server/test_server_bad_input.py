"""Bad input gets OpenAI's error body with the right status (400, 401, 404),
never a 422 or a 500, and leaves the server serving with every block free."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pagedrs import EngineArgs
from pagedrs.engine.async_llm import AsyncLLM
from pagedrs.entrypoints.openai.api_server import build_app
from server_utils import ServerThread, all_blocks_free, torch_threads, wait_for

API_KEY = "secret"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
CMPL = "/v1/completions"
CHAT = "/v1/chat/completions"
P = {"model": "tiny", "prompt": "Hello"}
M = {"model": "tiny", "messages": [{"role": "user", "content": "Hello"}]}
LONG_PROMPT = "word " * 300  # over max_model_len=256 tokens


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path) -> Iterator[ServerThread]:
    engine = AsyncLLM(EngineArgs(model=str(tiny_model_dir), max_model_len=256), torch_threads=1)
    with torch_threads(1), ServerThread(build_app(engine, ["tiny"], api_key=API_KEY)) as srv:
        yield srv


# (id, path, JSON body or raw bytes, status, param, code)
CASES: list[tuple[str, str, Any, int, str | None, str | None]] = [
    # invalid values
    ("max_tokens=0", CMPL, {**P, "max_tokens": 0}, 400, "max_tokens", None),
    ("max_tokens<0", CHAT, {**M, "max_tokens": -5}, 400, "max_tokens", None),
    ("max_completion_tokens=0", CHAT, {**M, "max_completion_tokens": 0}, 400,
     "max_completion_tokens", None),
    ("temperature<0", CMPL, {**P, "temperature": -0.5}, 400, "temperature", None),
    ("top_p=0", CMPL, {**P, "top_p": 0}, 400, "top_p", None),
    ("top_p>1", CHAT, {**M, "top_p": 1.5}, 400, "top_p", None),
    ("n=0", CMPL, {**P, "n": 0}, 400, "n", None),
    ("n>128", CHAT, {**M, "n": 1000}, 400, "n", None),
    ("best_of<n", CMPL, {**P, "n": 3, "best_of": 2}, 400, "best_of", None),
    ("stream best_of>n", CMPL, {**P, "best_of": 3, "stream": True}, 400, "best_of", None),
    ("presence_penalty>2", CMPL, {**P, "presence_penalty": 3.0}, 400, "presence_penalty", None),
    ("frequency_penalty<-2", CHAT, {**M, "frequency_penalty": -2.5}, 400,
     "frequency_penalty", None),
    ("seed<0", CMPL, {**P, "seed": -1}, 400, "seed", None),
    ("empty stop", CMPL, {**P, "stop": [""]}, 400, "stop", None),
    ("logprobs>20", CMPL, {**P, "logprobs": 21}, 400, "logprobs", None),
    ("logprobs<0", CMPL, {**P, "logprobs": -1}, 400, "logprobs", None),
    ("top_logprobs>20", CHAT, {**M, "logprobs": True, "top_logprobs": 21}, 400,
     "top_logprobs", None),
    ("top_logprobs without logprobs", CHAT, {**M, "top_logprobs": 2}, 400, "top_logprobs", None),
    ("top_k<-1", CMPL, {**P, "top_k": -5}, 400, "top_k", None),
    ("priority under fcfs", CHAT, {**M, "priority": 1}, 400, "priority", None),
    ("priority past int64", CMPL, {**P, "priority": 2**63}, 400, "priority", None),
    ("min_tokens>max_tokens", CMPL, {**P, "max_tokens": 2, "min_tokens": 5}, 400,
     "min_tokens", None),
    ("stream_options without stream", CMPL, {**P, "stream_options": {"include_usage": True}},
     400, "stream_options", None),
    ("logit_bias", CMPL, {**P, "logit_bias": {"50256": -100}}, 400, "logit_bias", None),
    ("suffix", CMPL, {**P, "suffix": "end"}, 400, "suffix", None),
    ("tools", CHAT, {**M, "tools": [{"type": "function"}]}, 400, "tools", None),
    ("unknown response_format", CHAT, {**M, "response_format": {"type": "xml"}}, 400,
     "response_format", None),
    # structured outputs
    ("json_schema without schema", CHAT,
     {**M, "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, 400,
     "response_format", None),
    ("invalid json_schema", CMPL,
     {**P, "response_format": {"type": "json_schema", "json_schema": {"name": "x",
                                                                     "schema": {"type": 5}}}},
     400, "response_format", None),
    ("invalid guided_json", CHAT, {**M, "guided_json": {"type": "nope"}}, 400, "guided_json",
     None),
    ("guided_json not JSON", CMPL, {**P, "guided_json": "{oops"}, 400, "guided_json", None),
    ("invalid guided_regex", CMPL, {**P, "guided_regex": "(ab"}, 400, "guided_regex", None),
    ("empty guided_choice", CHAT, {**M, "guided_choice": []}, 400, "guided_choice", None),
    ("invalid guided_grammar", CMPL, {**P, "guided_grammar": "root ::= undefined"}, 400,
     "guided_grammar", None),
    ("guided_whitespace_pattern", CMPL,
     {**P, "guided_json": {"type": "object"}, "guided_whitespace_pattern": " *"}, 400,
     "guided_whitespace_pattern", None),
    ("two kinds of structured output", CHAT,
     {**M, "guided_regex": "a+", "response_format": {"type": "json_object"}}, 400,
     "guided_regex", None),
    ("two kinds in structured_outputs", CMPL,
     {**P, "structured_outputs": {"regex": "a+", "choice": ["a"]}}, 400, "structured_outputs",
     None),
    ("unknown structured_outputs field", CMPL, {**P, "structured_outputs": {"regexp": "a"}},
     400, "structured_outputs", None),
    ("structural_tag", CMPL, {**P, "structured_outputs": {"structural_tag": "{}"}}, 400,
     "structured_outputs", None),
    ("guided_choice as string", CHAT, {**M, "guided_choice": "yes"}, 400, "guided_choice",
     None),
    ("image content part", CHAT,
     {**M, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400,
     "messages", None),
    # prompts
    ("empty prompt", CMPL, {**P, "prompt": ""}, 400, "prompt", None),
    ("empty prompt list", CMPL, {**P, "prompt": []}, 400, "prompt", None),
    ("more prompts than the queue holds", CMPL, {**P, "prompt": ["a"] * 1025}, 400, "prompt",
     None),
    ("token id out of vocab", CMPL, {**P, "prompt": [1, 10**7]}, 400, "prompt", None),
    ("over-long prompt", CMPL, {**P, "prompt": LONG_PROMPT}, 400, "prompt",
     "context_length_exceeded"),
    ("over-long chat", CHAT, {**M, "messages": [{"role": "user", "content": LONG_PROMPT}]}, 400,
     "messages", "context_length_exceeded"),
    ("prompt + max_tokens over context", CMPL, {**P, "max_tokens": 300}, 400, "max_tokens",
     "context_length_exceeded"),
    ("empty messages", CHAT, {**M, "messages": []}, 400, "messages", None),
    ("user message without content", CHAT, {**M, "messages": [{"role": "user"}]}, 400,
     "messages", None),
    ("user message with null content", CHAT,
     {**M, "messages": [{"role": "user", "content": None}]}, 400, "messages", None),
    ("unknown role", CHAT, {**M, "messages": [{"role": "robot", "content": "hi"}]}, 400,
     "messages", None),
    # wrong types
    ("max_tokens as string", CMPL, {**P, "max_tokens": "10"}, 400, "max_tokens", None),
    ("max_tokens as float", CMPL, {**P, "max_tokens": 10.5}, 400, "max_tokens", None),
    ("temperature as string", CHAT, {**M, "temperature": "hot"}, 400, "temperature", None),
    ("stream as string", CMPL, {**P, "stream": "yes"}, 400, "stream", None),
    ("n as bool", CMPL, {**P, "n": True}, 400, "n", None),
    ("prompt as object", CMPL, {**P, "prompt": {"text": "hi"}}, 400, "prompt", None),
    ("messages as string", CHAT, {**M, "messages": "hello"}, 400, "messages", None),
    ("content as number", CHAT, {**M, "messages": [{"role": "user", "content": 5}]}, 400,
     "messages", None),
    ("stop as number", CMPL, {**P, "stop": 3}, 400, "stop", None),
    ("missing model", CMPL, {"prompt": "hi"}, 400, "model", None),
    ("missing prompt", CMPL, {"model": "tiny"}, 400, "prompt", None),
    ("missing messages", CHAT, {"model": "tiny"}, 400, "messages", None),
    # body
    ("malformed JSON", CMPL, b'{"model": "tiny", "prompt": ', 400, None, "invalid_json"),
    ("JSON array body", CHAT, b"[1, 2]", 400, None, None),
    ("empty body", CMPL, b"", 400, None, None),
    # model
    ("unknown model", CMPL, {**P, "model": "gpt-9"}, 404, "model", "model_not_found"),
    ("unknown model (chat)", CHAT, {**M, "model": "gpt-9"}, 404, "model", "model_not_found"),
]  # fmt: skip


def _check_error(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"}
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    expected_type = "server_error" if status >= 500 else "invalid_request_error"
    assert err["type"] == expected_type
    return err


@pytest.mark.parametrize(
    ("path", "body", "status", "param", "code"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_bad_input(
    server: ServerThread,
    path: str,
    body: Any,
    status: int,
    param: str | None,
    code: str | None,
) -> None:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {**AUTH, "Content-Type": "application/json"}
    r = httpx.post(server.url + path, content=content, headers=headers, timeout=30)
    err = _check_error(r, status)
    assert err["param"] == param
    if code is not None:
        assert err["code"] == code


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}, {"X-Api-Key": API_KEY}],
    ids=["missing", "wrong key", "no Bearer", "other header"],
)
def test_api_key_required(server: ServerThread, headers: dict[str, str]) -> None:
    for method, path, content in [
        ("POST", CMPL, json.dumps(P)),
        ("POST", CHAT, b"{malformed"),  # auth comes before the body is read
        ("GET", "/v1/models", None),
    ]:
        r = httpx.request(method, server.url + path, content=content, headers=headers)
        assert _check_error(r, 401)["code"] == "invalid_api_key"
    # health and metrics stay open
    assert httpx.get(f"{server.url}/health").status_code == 200
    assert httpx.get(f"{server.url}/metrics").status_code == 200


def test_unknown_route_and_method(server: ServerThread) -> None:
    _check_error(httpx.get(f"{server.url}/v1/nothing", headers=AUTH), 404)
    _check_error(httpx.get(f"{server.url}{CMPL}", headers=AUTH), 405)


def test_server_still_serves_after_bad_input(server: ServerThread) -> None:
    r = httpx.post(server.url + CMPL, json={**P, "max_tokens": 4}, headers=AUTH, timeout=30)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
    wait_for(lambda: all_blocks_free(server.url), what="all blocks free")
