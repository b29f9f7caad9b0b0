"""The prefix cache and KV events know the adapter; adapters that cannot run
are refused by name and the engine keeps serving; the host-memory cache
holds at most ``max_cpu_loras`` adapters, least recently used evicted."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from lora_models import build_base, make_adapter
from pagedrs import LLM, LoRARequest, SamplingParams, _core
from pagedrs.engine.arg_utils import EngineArgs
from pagedrs.kv_events import to_wire

GREEDY = SamplingParams(max_tokens=4, temperature=0.0)
ATTN = {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]}


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path) -> Path:
    return build_base("llama", tmp_path_factory.mktemp("base") / "llama", default_model_dir)


@pytest.fixture(scope="module")
def adapter_dirs(tmp_path_factory: pytest.TempPathFactory, base: Path) -> list[Path]:
    root = tmp_path_factory.mktemp("adapters")
    return [make_adapter(base, root / f"a{i}", i, **ATTN) for i in range(3)]


def _llm(base: Path, **kw) -> LLM:
    args = {"enable_lora": True, "max_loras": 2, "max_lora_rank": 8, "max_model_len": 128}
    return LLM(str(base), num_gpu_blocks_override=64, block_size=16, **{**args, **kw})


def _lora(i: int, folder: Path) -> LoRARequest:
    return LoRARequest(f"a{i}", i + 1, str(folder))


def test_two_adapters_never_share_a_block_and_one_adapter_hits(base, adapter_dirs) -> None:
    llm = _llm(base)
    prompt = {"prompt_token_ids": list(range(300, 340))}  # 2 full blocks of 16
    a, b = _lora(0, adapter_dirs[0]), _lora(1, adapter_dirs[1])

    def cached(lora: LoRARequest | None) -> int | None:
        return llm.generate(prompt, GREEDY, use_tqdm=False, lora_request=lora)[0].num_cached_tokens

    assert cached(a) == 0
    assert cached(a) == 32, "the same adapter hits its blocks"
    assert cached(b) == 0, "another adapter never shares them"
    assert cached(None) == 0, "nor does the base model"
    assert cached(b) == 32 and cached(None) == 32


def test_kv_events_and_block_hashes_carry_the_adapter() -> None:
    sched = _core.Scheduler(16, 4, 4, 64, 32, enable_kv_cache_events=True)
    tokens = np.arange(100, 109, dtype=np.int64)  # 2 full blocks of 4
    sched.add_request(1, tokens, 1, [], lora_id=7)
    sched.add_request(2, tokens, 1, [])
    out = sched.schedule()
    assert out is not None
    assert out.batch.seq_lora_ids.tolist() == [7, 0]
    sched.update(np.array([5, 5], dtype=np.int64))
    stored = [e for e in sched.take_kv_events() if e.kind == "stored"]
    by_lora = {e.lora_id: e for e in stored}
    assert set(by_lora) == {7, None}
    ids = tokens.tolist()
    assert by_lora[7].block_hashes == _core.block_hashes(ids, 4, None, 7)[:2]
    assert by_lora[None].block_hashes == _core.block_hashes(ids, 4)[:2]
    assert _core.block_hashes(ids, 4, None, 7) != _core.block_hashes(ids, 4, None, 8)
    assert to_wire(by_lora[7], "CPU").lora_id == 7
    assert to_wire(by_lora[None], "CPU").lora_id is None


def test_scheduler_admits_at_most_max_loras_adapters() -> None:
    sched = _core.Scheduler(64, 4, 16, 256, 64)
    sched.set_max_loras(2)
    prompt = np.arange(100, 105, dtype=np.int64)
    for rid, lora in [(1, 5), (2, 0), (3, 6), (4, 7), (5, 5)]:
        sched.add_request(rid, prompt, 4, [], lora_id=lora)
    out = sched.schedule()
    assert out is not None and out.batch.seq_request_ids.tolist() == [1, 2, 3]
    assert sched.running_loras() == [5, 6]
    with pytest.raises(ValueError, match="max_loras"):
        sched.set_max_loras(0)


def _expect(llm: LLM, lora: LoRARequest, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        llm.generate("Hello", GREEDY, use_tqdm=False, lora_request=lora)


def test_unfit_adapters_are_refused_by_name_and_the_engine_keeps_serving(
    base: Path, adapter_dirs, tmp_path: Path, default_model_dir: Path
) -> None:
    llm = _llm(base)
    want = llm.generate("Hello", GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    embed = make_adapter(
        base, tmp_path / "embed", 1, r=4, lora_alpha=8, target_modules=["embed_tokens", "q_proj"]
    )
    _expect(llm, LoRARequest("embed", 11, str(embed)), "embed_tokens")
    wide = make_adapter(base, tmp_path / "wide", 1, r=16, lora_alpha=8, target_modules=["q_proj"])
    _expect(llm, LoRARequest("wide", 12, str(wide)), "max_lora_rank=8")
    other_base = build_base("llama", tmp_path / "other", default_model_dir, intermediate_size=96)
    mlp = make_adapter(
        other_base, tmp_path / "mlp96", 1, r=4, lora_alpha=8, target_modules=["up_proj"]
    )
    _expect(
        llm, LoRARequest("mlp96", 13, str(mlp)), r"out_features 96 != the base projection's 128"
    )
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "adapter_config.json").write_text(
        (adapter_dirs[0] / "adapter_config.json").read_text()
    )
    (corrupt / "adapter_model.safetensors").write_bytes(b"\x10\x00\x00\x00not a safetensors file")
    _expect(llm, LoRARequest("corrupt", 14, str(corrupt)), "adapter_model.safetensors")
    gguf = tmp_path / "lora.gguf"
    gguf.write_bytes(b"GGUF")
    _expect(llm, LoRARequest("gguf", 15, str(gguf)), "lora.gguf: is not a readable GGUF file")
    _expect(llm, LoRARequest("missing", 16, str(tmp_path / "nope")), "no such folder")
    # One id, two folders.
    llm.generate("Hello", GREEDY, use_tqdm=False, lora_request=_lora(0, adapter_dirs[0]))
    _expect(llm, LoRARequest("a0", 1, str(adapter_dirs[1])), "lora_int_id 1 is bound")
    # Still serving, every block free, the refused adapters not loaded.
    assert llm.generate("Hello", GREEDY, use_tqdm=False)[0].outputs[0].token_ids == want
    stats = llm.kv_cache_stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"]
    assert stats["num_loaded_loras"] == 1


def test_lora_request_needs_enable_lora(base: Path, adapter_dirs) -> None:
    llm = LLM(str(base), num_gpu_blocks_override=32, max_model_len=64)
    _expect(llm, _lora(0, adapter_dirs[0]), "enable_lora")


def test_engine_args_name_the_lora_field() -> None:
    with pytest.raises(ValueError, match="max_cpu_loras"):
        EngineArgs(enable_lora=True, max_loras=4, max_cpu_loras=2)
    with pytest.raises(ValueError, match="max_lora_rank"):
        EngineArgs(enable_lora=True, max_lora_rank=0)
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        EngineArgs(enable_lora=True, tensor_parallel_size=2)


def test_host_memory_holds_max_cpu_loras_least_recently_used_evicted(base, adapter_dirs) -> None:
    llm = _llm(base, max_loras=1, max_cpu_loras=2)
    loras = [_lora(i, d) for i, d in enumerate(adapter_dirs)]
    first = [llm.generate("Hello", GREEDY, use_tqdm=False, lora_request=x)[0] for x in loras]
    manager = llm.llm_engine.engine_core.lora
    assert [r.lora_int_id for r in manager.registry.loaded()] == [2, 3]
    stats = llm.kv_cache_stats()
    assert stats["num_loaded_loras"] == 2
    assert stats["lora_bytes"] == sum(manager.registry.get(i).nbytes for i in (2, 3))
    # The evicted adapter is read again, with the same outputs.
    again = llm.generate("Hello", GREEDY, use_tqdm=False, lora_request=loras[0])[0]
    assert again.outputs[0].token_ids == first[0].outputs[0].token_ids
    assert [r.lora_int_id for r in manager.registry.loaded()] == [3, 1]
