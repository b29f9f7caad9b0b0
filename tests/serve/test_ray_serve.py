"""Two engine replicas of the tiny model on a local Ray Serve, behind one
OpenAI endpoint: outputs equal one engine's, streaming, routing by the
replicas' KV events, and a replica killed mid-stream."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pagedrs.entrypoints.openai as openai_pkg
import pytest
from pagedrs import LLM, EngineArgs, SamplingParams
from pagedrs.entrypoints.openai.chat_options import ChatOptions
from reference import PROMPTS
from server_utils import metrics, wait_for
from transformers import AutoTokenizer

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")

BLOCK = 8
MODEL = "tiny"
TOOLS_TEMPLATE = Path(openai_pkg.__file__).parent / "chat_templates" / "chatml_tools.jinja"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def url(tiny_model_dir: Path) -> Iterator[str]:
    from pagedrs.serve import build_serve_app

    port = _free_port()
    ray.init(
        num_cpus=4, include_dashboard=False, log_to_driver=False, object_store_memory=256 << 20
    )
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        args = EngineArgs(
            model=str(tiny_model_dir),
            device="cpu",
            block_size=BLOCK,
            max_model_len=256,
            num_gpu_blocks_override=128,
        )
        app = build_serve_app(
            args,
            data_parallel_size=2,
            served_model_names=[MODEL],
            # Only the KV events tell the router where prefixes are.
            router_kwargs={"expect_ttl_s": 0.0},
            routing_stats_period_s=0.5,
            chat_options=ChatOptions(
                chat_template=TOOLS_TEMPLATE.read_text(),
                enable_auto_tool_choice=True,
                tool_call_parser="hermes",
            ),
        )
        serve.run(app, name="pagedrs", route_prefix="/")
        # One more replica whose ingress reads the reply as reasoning.
        think = build_serve_app(
            args,
            served_model_names=[MODEL],
            chat_options=ChatOptions(
                chat_template=TOOLS_TEMPLATE.read_text(), reasoning_parser="deepseek_r1"
            ),
        )
        serve.run(think, name="think", route_prefix="/think")
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


def _complete(url: str, **body: Any) -> dict[str, Any]:
    r = httpx.post(f"{url}/v1/completions", json={"model": MODEL, **body}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def _sse(url: str, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The events of a streamed response, up to ``[DONE]``."""
    events = []
    with httpx.stream("POST", f"{url}{path}", json={"model": MODEL, **body}, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[len("data: ") :]))
    return events


def test_outputs_equal_one_engine(url: str, tiny_model_dir: Path) -> None:
    prompts = PROMPTS[:4]
    llm = LLM(str(tiny_model_dir), device="cpu", max_model_len=256)
    params = SamplingParams(max_tokens=16, temperature=0.0)
    refs = [o.outputs[0] for o in llm.generate(prompts, params, use_tqdm=False)]
    llm.shutdown()
    for prompt, ref in zip(prompts, refs, strict=True):
        out = _complete(url, prompt=prompt, max_tokens=16, temperature=0)
        assert out["choices"][0]["text"] == ref.text
        assert out["usage"]["completion_tokens"] == len(ref.token_ids)
        chunks = _sse(
            url,
            "/v1/completions",
            {"prompt": prompt, "max_tokens": 16, "temperature": 0, "stream": True},
        )
        assert "".join(c["choices"][0]["text"] for c in chunks) == ref.text
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 12, "temperature": 0}
    r = httpx.post(f"{url}/v1/chat/completions", json={"model": MODEL, **chat}, timeout=60)
    assert r.status_code == 200
    text = r.json()["choices"][0]["message"]["content"]
    chunks = _sse(url, "/v1/chat/completions", {**chat, "stream": True})
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == text
    models = httpx.get(f"{url}/v1/models").json()
    assert [m["id"] for m in models["data"]] == [MODEL]
    bad = httpx.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": "x", "n": 0})
    assert bad.status_code == 400


def test_chat_options(url: str, tiny_model_dir: Path) -> None:
    """``build_serve_app(chat_options=)``: the ingress renders tools with the
    given template and serves ``"auto"`` (a 400 without
    ``enable_auto_tool_choice`` and a parser); the second app's deepseek_r1
    parser returns the same greedy text as reasoning."""
    schema = {
        "type": "object",
        "properties": {"unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["unit"],
        "additionalProperties": False,
    }
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": schema}}]
    ask = {"model": MODEL, "messages": [{"role": "user", "content": "Weather?"}], "tools": tools}
    r = httpx.post(f"{url}/tokenize", json=ask, timeout=60)
    assert r.status_code == 200
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    text = tok.apply_chat_template(
        ask["messages"],
        tools=tools,
        chat_template=TOOLS_TEMPLATE.read_text(),
        tokenize=False,
        add_generation_prompt=True,
    )
    assert "<tools>" in text
    assert r.json()["tokens"] == tok(text, add_special_tokens=False).input_ids
    auto = {**ask, "tool_choice": "auto", "max_tokens": 4, "temperature": 0}
    assert httpx.post(f"{url}/v1/chat/completions", json=auto, timeout=60).status_code == 200
    no_parser = httpx.post(f"{url}/think/v1/chat/completions", json=auto, timeout=60)
    assert no_parser.status_code == 400 and no_parser.json()["error"]["param"] == "tool_choice"
    plain = {"model": MODEL, "messages": ask["messages"], "max_tokens": 8, "temperature": 0}
    r = httpx.post(f"{url}/v1/chat/completions", json=plain, timeout=60).json()
    t = httpx.post(f"{url}/think/v1/chat/completions", json=plain, timeout=60).json()
    text = r["choices"][0]["message"]["content"]
    assert text and "</think>" not in text
    assert t["choices"][0]["message"]["reasoning_content"] == text
    assert t["choices"][0]["message"]["content"] is None


def test_routes_by_the_replicas_kv_events(url: str) -> None:
    # Two 64-token prefixes (8 blocks each), each request with its own last tokens.
    prefixes = [[1000 + 64 * p + t for t in range(64)] for p in range(2)]

    def prompt(p: int, i: int) -> list[int]:
        return prefixes[p] + [5000 + 10 * i + p, 7, 9]

    for p in range(2):  # cold: where each prefix lands first
        _complete(url, prompt=prompt(p, 0), max_tokens=2, temperature=0)

    def hits() -> float:
        return metrics(url)["pagedrs:prefix_cache_hits_total"]

    # The router subscribes once Ray Serve reports the replicas' endpoints:
    # then a warm prefix is found, whichever replica holds it.
    def warm() -> bool:
        before = hits()
        for i in range(4):
            _complete(url, prompt=prompt(0, 90 + i), max_tokens=1, temperature=0)
        return hits() - before == 4 * 64

    wait_for(warm, timeout=30, what="the router to follow the KV events")
    before = hits()
    for i in range(1, 7):
        for p in range(2):
            _complete(url, prompt=prompt(p, i), max_tokens=2, temperature=0)
    # Every warm request found its whole 8-block prefix cached where it went.
    assert hits() - before == 12 * 64


@pytest.fixture(scope="module")
def lora_url(url: str, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """Two more replicas, with ``enable_lora``, serving the adapter "a1" (a
    PEFT folder) at ``/lora``; yields (its base URL, the adapter's folder)."""
    import torch
    from pagedrs.serve import build_serve_app

    peft = pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    folder = tmp_path_factory.mktemp("ray-lora") / "a1"
    torch.manual_seed(5)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    config = peft.LoraConfig(
        r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    model = peft.get_peft_model(base, config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.5)
    model.save_pretrained(folder)
    args = EngineArgs(
        model=str(tiny_model_dir),
        device="cpu",
        block_size=BLOCK,
        max_model_len=256,
        num_gpu_blocks_override=128,
        enable_lora=True,
        max_lora_rank=8,
    )
    app = build_serve_app(
        args,
        data_parallel_size=2,
        served_model_names=[MODEL],
        router_kwargs={"expect_ttl_s": 0.0},
        routing_stats_period_s=0.5,
        replica_num_cpus=0.5,
        lora_modules=[("a1", str(folder))],
    )
    serve.run(app, name="lora", route_prefix="/lora")
    yield f"{url}/lora", folder
    serve.delete("lora")


def test_adapters_are_served_and_routed_by_adapter(lora_url, tiny_model_dir: Path) -> None:
    from pagedrs import LoRARequest

    base_url, folder = lora_url
    models = httpx.get(f"{base_url}/v1/models").json()
    assert [m["id"] for m in models["data"]] == [MODEL, "a1"]
    llm = LLM(str(tiny_model_dir), device="cpu", max_model_len=256, enable_lora=True)
    params = SamplingParams(max_tokens=12, temperature=0.0)
    want = llm.generate(
        PROMPTS[0], params, use_tqdm=False, lora_request=LoRARequest("a1", 1, str(folder))
    )[0].outputs[0]
    base = llm.generate(PROMPTS[0], params, use_tqdm=False)[0].outputs[0]
    llm.shutdown()
    assert want.text != base.text
    out = _complete(base_url, model="a1", prompt=PROMPTS[0], max_tokens=12, temperature=0)
    assert out["choices"][0]["text"] == want.text
    # Routing: the router hashes the adapter's id as the replicas do, so a
    # request of the adapter goes to the replica holding its prefix.
    prefixes = [[2000 + 64 * p + t for t in range(64)] for p in range(2)]

    def prompt(p: int, i: int) -> list[int]:
        return prefixes[p] + [6000 + 10 * i + p, 7, 9]

    def hits() -> float:
        return metrics(base_url)["pagedrs:prefix_cache_hits_total"]

    for p in range(2):
        _complete(base_url, model="a1", prompt=prompt(p, 0), max_tokens=2, temperature=0)

    def warm() -> bool:
        before = hits()
        for i in range(4):
            _complete(base_url, model="a1", prompt=prompt(0, 90 + i), max_tokens=1, temperature=0)
        return hits() - before == 4 * 64

    wait_for(warm, timeout=30, what="the router to follow the adapter's KV events")
    before = hits()
    for i in range(1, 7):
        for p in range(2):
            _complete(base_url, model="a1", prompt=prompt(p, i), max_tokens=2, temperature=0)
    assert hits() - before == 12 * 64
    # The base model never reads the adapter's blocks.
    before = hits()
    _complete(base_url, prompt=prompt(0, 50), max_tokens=1, temperature=0)
    assert hits() == before


def _replica_actors() -> list[Any]:
    names = [
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["name"].startswith("SERVE_REPLICA::pagedrs#EngineReplica#")
    ]
    return [ray.get_actor(n, namespace="serve") for n in names]


def test_dead_replica_fails_its_streams_and_the_rest_serve(url: str) -> None:
    body = {"max_tokens": 200, "ignore_eos": True, "temperature": 0, "stream": True}
    results: list[list[dict[str, Any]]] = [[], []]
    first_chunk = [threading.Event(), threading.Event()]

    def stream(k: int) -> None:
        req = {"model": MODEL, "prompt": [300 + 40 * k + t for t in range(20)], **body}
        with httpx.stream("POST", f"{url}/v1/completions", json=req, timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    results[k].append(json.loads(line[len("data: ") :]))
                    first_chunk[k].set()
        first_chunk[k].set()

    threads = [threading.Thread(target=stream, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for e in first_chunk:
        assert e.wait(60)
    actors = _replica_actors()
    assert len(actors) == 2
    busy = [ray.get(a.get_num_ongoing_requests.remote()) for a in actors]
    victim = max(range(2), key=lambda i: busy[i])
    ray.kill(actors[victim], no_restart=True)
    for t in threads:
        t.join(120)
    failed = [r for r in results if "error" in r[-1]]
    done = [r for r in results if "error" not in r[-1]]
    assert len(failed) == busy[victim] >= 1
    for r in failed:
        assert r[-1]["error"]["code"] == "engine_dead"
        assert "engine replica" in r[-1]["error"]["message"]
        assert "died" in r[-1]["error"]["message"]
    for r in done:
        assert r[-1]["choices"][0]["finish_reason"] == "length"
    # The survivor keeps serving (a request sent to the dead one is sent again).
    for i in range(4):
        out = _complete(url, prompt=f"after the fault {i}", max_tokens=4, temperature=0)
        assert out["usage"]["completion_tokens"] == 4
