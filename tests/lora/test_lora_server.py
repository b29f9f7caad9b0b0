"""The OpenAI-compatible server with LoRA adapters, over the engine-core
process (the ``AddRequest`` message carries the ``LoRARequest``): the
adapter's name as ``model``, ``/v1/models``, 404 for an unknown name, the
runtime load / unload endpoints behind ``PAGEDRS_ALLOW_RUNTIME_LORA_UPDATING``
(a corrupt adapter a 400 naming its file, the server serving on)."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from gguf_lora_file import write_gguf_lora
from lora_models import build_base, make_adapter
from pagedrs import LLM, BeamSearchParams, LoRARequest, SamplingParams
from pagedrs.engine.arg_utils import EngineArgs
from pagedrs.engine.async_llm import AsyncLLM
from pagedrs.entrypoints.openai.api_server import build_app
from pagedrs.entrypoints.openai.serving_lora import (
    ALLOW_RUNTIME_LORA_UPDATING,
    LoRAModules,
    parse_lora_modules,
)
from server_utils import ServerThread, all_blocks_free, torch_threads, wait_for

PROMPT = "The capital of France is"
ATTN = {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj", "down_proj"]}
ENGINE = {"enable_lora": True, "max_loras": 2, "max_lora_rank": 8, "max_model_len": 128}


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lora-server")
    base = build_base("llama", root / "base", default_model_dir)
    return {
        "base": base,
        "a1": make_adapter(base, root / "a1", 1, **ATTN),
        "a2": make_adapter(base, root / "a2", 2, **ATTN),
    }


@pytest.fixture(scope="module")
def offline(folders: dict[str, Path]) -> dict[str | None, str]:
    """Greedy texts of the offline engine: base and each adapter."""
    llm = LLM(str(folders["base"]), num_gpu_blocks_override=64, **ENGINE)
    params = SamplingParams(max_tokens=12, temperature=0.0)
    out: dict[str | None, str] = {}
    for i, name in enumerate([None, "a1", "a2"]):
        lora = None if name is None else LoRARequest(name, i, str(folders[name]))
        out[name] = (
            llm.generate(PROMPT, params, use_tqdm=False, lora_request=lora)[0].outputs[0].text
        )
    return out


def _server(folders: dict[str, Path]) -> ServerThread:
    engine = AsyncLLM(
        EngineArgs(model=str(folders["base"]), num_gpu_blocks_override=64, **ENGINE),
        torch_threads=1,
    )
    modules = LoRAModules(["base"], 8, parse_lora_modules([f"a1={folders['a1']}"]))
    return ServerThread(build_app(engine, ["base"], root_model="tiny", lora_modules=modules))


@pytest.fixture(scope="module")
def server(folders: dict[str, Path]) -> Iterator[ServerThread]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(ALLOW_RUNTIME_LORA_UPDATING, "1")
        srv = _server(folders)
    with torch_threads(1), srv:
        yield srv


def _complete(url: str, model: str) -> httpx.Response:
    body = {"model": model, "prompt": PROMPT, "max_tokens": 12, "temperature": 0.0}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=120)


def test_adapter_names_are_models_with_the_offline_outputs(server, offline) -> None:
    models = httpx.get(f"{server.url}/v1/models", timeout=10).json()["data"]
    assert [m["id"] for m in models] == ["base", "a1"]
    for name in ("base", "a1"):
        r = _complete(server.url, name)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == offline[None if name == "base" else name]
    chat = httpx.post(
        f"{server.url}/v1/chat/completions",
        json={"model": "a1", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
        timeout=120,
    )
    assert chat.status_code == 200, chat.text


def test_unknown_adapter_is_a_404_in_openai_form(server) -> None:
    r = _complete(server.url, "nope")
    assert r.status_code == 404
    err = r.json()["error"]
    assert err["code"] == "model_not_found" and err["param"] == "model"
    assert "a1" in err["message"]


def test_load_and_unload_under_load(server, folders, offline, tmp_path: Path) -> None:
    url = server.url
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        running = [pool.submit(_complete, url, "a1") for _ in range(3)]
        r = httpx.post(
            f"{url}/v1/load_lora_adapter",
            json={"lora_name": "a2", "lora_path": str(folders["a2"])},
            timeout=60,
        )
        assert r.status_code == 200, r.text
        assert all(f.result().json()["choices"][0]["text"] == offline["a1"] for f in running)
    assert _complete(url, "a2").json()["choices"][0]["text"] == offline["a2"]
    ids = [m["id"] for m in httpx.get(f"{url}/v1/models", timeout=10).json()["data"]]
    assert ids == ["base", "a1", "a2"]
    # A name already served, and a corrupt adapter: 400 naming it, nothing changes.
    again = httpx.post(
        f"{url}/v1/load_lora_adapter",
        json={"lora_name": "a1", "lora_path": str(folders["a2"])},
        timeout=60,
    )
    assert again.status_code == 400 and again.json()["error"]["param"] == "lora_name"
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "adapter_config.json").write_text(
        (folders["a1"] / "adapter_config.json").read_text()
    )
    (corrupt / "adapter_model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}")
    r = httpx.post(
        f"{url}/v1/load_lora_adapter",
        json={"lora_name": "bad", "lora_path": str(corrupt)},
        timeout=60,
    )
    assert r.status_code == 400
    assert str(corrupt / "adapter_model.safetensors") in r.json()["error"]["message"]
    assert _complete(url, "base").json()["choices"][0]["text"] == offline[None]
    # Unload: the name is gone (404), an unknown one is a 404 too.
    r = httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "a2"}, timeout=10)
    assert r.status_code == 200, r.text
    assert _complete(url, "a2").status_code == 404
    r = httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "a2"}, timeout=10)
    assert r.status_code == 404
    wait_for(lambda: all_blocks_free(url))


def test_gguf_adapter_files_load_and_a_corrupt_one_is_a_400(
    server, folders, offline, tmp_path: Path
) -> None:
    url = server.url
    file = write_gguf_lora(folders["a2"], tmp_path / "a2.gguf", "llama", 4, 2)
    r = httpx.post(
        f"{url}/v1/load_lora_adapter", json={"lora_name": "g2", "lora_path": str(file)}, timeout=60
    )
    assert r.status_code == 200, r.text
    assert _complete(url, "g2").json()["choices"][0]["text"] == offline["a2"]
    corrupt = tmp_path / "corrupt.gguf"
    corrupt.write_bytes(file.read_bytes()[:200])
    r = httpx.post(
        f"{url}/v1/load_lora_adapter",
        json={"lora_name": "bad", "lora_path": str(corrupt)},
        timeout=60,
    )
    assert r.status_code == 400
    err = r.json()["error"]
    assert str(corrupt) in err["message"] and err["param"] == "lora_path"
    assert _complete(url, "bad").status_code == 404
    assert _complete(url, "base").json()["choices"][0]["text"] == offline[None]
    r = httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "g2"}, timeout=10)
    assert r.status_code == 200, r.text
    wait_for(lambda: all_blocks_free(url))


def test_beam_search_under_an_adapter_name(server, folders) -> None:
    llm = LLM(str(folders["base"]), num_gpu_blocks_override=64, **ENGINE)
    params = BeamSearchParams(beam_width=2, max_tokens=8)
    lora = LoRARequest("a1", 1, str(folders["a1"]))
    for model, lora_request in (("a1", lora), ("base", None)):
        want = llm.beam_search(PROMPT, params, use_tqdm=False, lora_request=lora_request)[0]
        body = {"model": model, "prompt": PROMPT, "max_tokens": 8, "n": 2}
        r = httpx.post(
            f"{server.url}/v1/completions", json={**body, "use_beam_search": True}, timeout=120
        )
        assert r.status_code == 200, r.text
        assert [c["text"] for c in r.json()["choices"]] == [c.text for c in want.outputs]


def test_runtime_updating_needs_the_environment_flag(folders, monkeypatch) -> None:
    monkeypatch.delenv(ALLOW_RUNTIME_LORA_UPDATING, raising=False)
    with torch_threads(1), _server(folders) as srv:
        r = httpx.post(
            f"{srv.url}/v1/load_lora_adapter",
            json={"lora_name": "a2", "lora_path": str(folders["a2"])},
            timeout=10,
        )
        assert r.status_code == 404
        assert _complete(srv.url, "a1").status_code == 200


def test_lora_modules_are_read_at_start(folders, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="name=path"):
        parse_lora_modules(["a1"])
    with pytest.raises(ValueError, match="already served"):
        LoRAModules(["base"], 8, [("base", str(folders["a1"]))])
    with pytest.raises(ValueError, match="no such folder"):
        LoRAModules(["base"], 8, [("x", str(tmp_path / "missing"))])
    # --lora-modules name=file.gguf: a GGUF LoRA file is read; a corrupt one names the file.
    file = write_gguf_lora(folders["a1"], tmp_path / "a1.gguf", "llama", 4, 2)
    assert LoRAModules(["base"], 8, [("g", str(file))]).request_of("g").lora_path == str(file)
    corrupt = tmp_path / "bad.gguf"
    corrupt.write_bytes(b"GGUF\x03\x00\x00\x00")
    with pytest.raises(ValueError, match="bad.gguf: is not a readable GGUF file"):
        LoRAModules(["base"], 8, [("x", str(corrupt))])
