"""Tensor parallelism on CPU (gloo): one scheduler, two ranks, each holding a
shard of the model and of every KV block; outputs equal one process's."""

from __future__ import annotations

from pathlib import Path

import pytest
from pagedrs import LLM, SamplingParams
from pagedrs.distributed.sharding import kv_head_range
from pagedrs.distributed.tp_runner import WorkerDiedError
from pagedrs.executor.interface import Executor
from reference import PROMPTS

GREEDY = SamplingParams(max_tokens=24, temperature=0.0)


def _ids(llm: LLM) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)]


def test_tiny_model_tp2_matches_single_process(tiny_model_dir: Path, tiny_reference) -> None:
    one = LLM(str(tiny_model_dir), max_model_len=128)
    two = LLM(str(tiny_model_dir), max_model_len=128, tensor_parallel_size=2)
    try:
        assert isinstance(one.llm_engine.engine_core.runner, Executor)
        assert isinstance(two.llm_engine.engine_core.runner, Executor)
        want = [r[:24] for r in tiny_reference]
        assert _ids(one) == want
        assert _ids(two) == want
        # Each rank holds half of the KV heads, so half of the KV memory.
        s1, s2 = one.kv_cache_stats(), two.kv_cache_stats()
        assert s2["num_total_blocks"] == s1["num_total_blocks"]
        assert 2 * s2["kv_cache_bytes_per_worker"] == s1["kv_cache_bytes_per_worker"]
        assert s2["num_free_blocks"] == s2["num_total_blocks"]
    finally:
        two.shutdown()


def test_default_model_tp2_matches_single_process(default_model_dir: Path, default_reference):
    llm = LLM(str(default_model_dir), max_model_len=256, tensor_parallel_size=2)
    try:
        assert [
            o.outputs[0].token_ids
            for o in llm.generate(PROMPTS, SamplingParams(max_tokens=32, temperature=0.0))
        ] == default_reference
    finally:
        llm.shutdown()


def test_dead_worker_is_a_clear_error(tiny_model_dir: Path) -> None:
    llm = LLM(str(tiny_model_dir), max_model_len=128, tensor_parallel_size=2)
    try:
        llm.llm_engine.engine_core.runner.procs[0].kill()
        llm.llm_engine.engine_core.runner.procs[0].join(timeout=10)
        with pytest.raises(WorkerDiedError, match="worker 1 died"):
            llm.generate(["Hello"], GREEDY)
        stats = llm.kv_cache_stats()
        assert stats["num_free_blocks"] == stats["num_total_blocks"], "the batch was aborted"
    finally:
        llm.shutdown()


def test_kv_heads_split_evenly_or_nearly() -> None:
    assert [kv_head_range(4, r, 2) for r in range(2)] == [(0, 2), (2, 4)]
    assert [kv_head_range(3, r, 2) for r in range(2)] == [(0, 2), (2, 3)]
    with pytest.raises(ValueError, match="KV heads"):
        kv_head_range(2, 0, 4)


def test_server_with_tp2(tiny_model_dir: Path) -> None:
    import httpx
    from pagedrs.engine.arg_utils import EngineArgs
    from pagedrs.engine.async_llm import AsyncLLM
    from pagedrs.entrypoints.openai.api_server import build_app
    from server_utils import ServerThread, all_blocks_free

    args = EngineArgs(model=str(tiny_model_dir), max_model_len=128, tensor_parallel_size=2)
    engine = AsyncLLM(args, engine_core_process=False)
    single = LLM(str(tiny_model_dir), max_model_len=128)
    want = single.generate(["Hello there"], SamplingParams(max_tokens=8, temperature=0.0))
    with ServerThread(build_app(engine, ["tiny"])) as srv:
        body = {"model": "tiny", "prompt": "Hello there", "max_tokens": 8, "temperature": 0}
        r = httpx.post(f"{srv.url}/v1/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == want[0].outputs[0].text
        assert all_blocks_free(srv.url)
    engine.shutdown()


def test_quantized_weights_are_refused_by_name(tiny_model_dir: Path) -> None:
    """Tensor parallelism does not shard quantized weights: the engine (before
    any worker starts) and ``shard_llama`` name the module and its format."""
    import torch
    from pagedrs.distributed.sharding import shard_llama
    from pagedrs.executor.quant.int8 import quantize_model_int8
    from transformers import AutoModelForCausalLM

    with pytest.raises(
        ValueError,
        match=r"tensor_parallel_size=2: model\.layers\.0\.self_attn\.q_proj "
        r"\(QuantizedLinearModule\) holds int8 quantized weights",
    ):
        LLM(str(tiny_model_dir), max_model_len=128, quantization="int8", tensor_parallel_size=2)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    quantize_model_int8(model)
    before = model.model.layers[0].self_attn.q_proj
    with pytest.raises(ValueError, match=r"q_proj \(QuantizedLinearModule\) holds int8"):
        shard_llama(model, 0, 2)
    assert model.model.layers[0].self_attn.q_proj is before  # nothing sharded
