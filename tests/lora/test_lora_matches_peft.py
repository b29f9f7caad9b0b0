"""LoRA adapters run exactly as transformers + peft runs them: greedy tokens
and the chosen tokens' logprobs equal the PEFT model's (adapter unmerged) and
the merged weights', on tiny llama, qwen2 and gemma3_text models and on
SmolLM2; a batch mixing three adapters and the base model gives each request
the bits it gets alone (batch-invariant projections)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from lora_models import ADAPTERS, BASES, build_base, check_output, make_adapter, peft_references
from pagedrs import LLM, LoRARequest, SamplingParams

MAX_TOKENS = 16
PROMPTS = ["The capital of France is", "Name three rivers."]


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def base_dirs(tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path):
    root = tmp_path_factory.mktemp("lora-bases")
    cache: dict[str, Path] = {}

    def get(case: str) -> Path:
        if case not in cache:
            cache[case] = build_base(case, root / case, default_model_dir)
        return cache[case]

    return get


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory, base_dirs):
    root = tmp_path_factory.mktemp("lora-adapters")
    cache: dict[tuple[str, str], Path] = {}

    def get(case: str, name: str) -> Path:
        key = (case, name)
        if key not in cache:
            seed = list(ADAPTERS).index(name) + 1
            cache[key] = make_adapter(base_dirs(case), root / case / name, seed, **ADAPTERS[name])
        return cache[key]

    return get


def _llm(model_dir: Path, **kw) -> LLM:
    return LLM(
        str(model_dir),
        enable_lora=True,
        max_loras=4,
        max_lora_rank=16,
        max_model_len=128,
        num_gpu_blocks_override=64,
        **kw,
    )


GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, logprobs=0)


@pytest.mark.parametrize("case", list(BASES))
def test_each_adapter_equals_peft_unmerged_and_merged(case: str, base_dirs, adapters) -> None:
    base = base_dirs(case)
    llm = _llm(base)
    for i, name in enumerate(ADAPTERS):
        folder = adapters(case, name)
        lora = LoRARequest(name, i + 1, str(folder))
        outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False, lora_request=lora)
        for merged in (False, True):
            refs = peft_references(base, folder, PROMPTS, MAX_TOKENS, merged=merged)
            for prompt, out in zip(PROMPTS, outs, strict=True):
                check_output(out, refs[prompt])
        # The adapter changes the output (the test would pass on the base model otherwise).
        base_refs = peft_references(base, None, PROMPTS[:1], MAX_TOKENS, merged=False)
        assert outs[0].outputs[0].token_ids != base_refs[PROMPTS[0]].tokens
    stats = llm.kv_cache_stats()
    assert stats["num_loaded_loras"] == len(ADAPTERS)
    assert stats["lora_bytes"] > 0 and stats["lora_slot_bytes"] > 0


@pytest.mark.parametrize("case", ["llama", "gemma3_text"])
def test_mixed_batch_gives_each_request_its_bits_alone(case: str, base_dirs, adapters) -> None:
    base = base_dirs(case)
    llm = _llm(base, batch_invariant=True)
    loras: list[LoRARequest | None] = [
        LoRARequest(name, i + 1, str(adapters(case, name))) for i, name in enumerate(ADAPTERS)
    ]
    loras.append(None)
    prompts = [p for p in PROMPTS for _ in loras]
    per_prompt = [lora for _ in PROMPTS for lora in loras]
    llm.reset_prefix_cache()
    mixed = llm.generate(prompts, GREEDY, use_tqdm=False, lora_request=per_prompt)
    for prompt, lora, out in zip(prompts, per_prompt, mixed, strict=True):
        llm.reset_prefix_cache()
        alone = llm.generate([prompt], GREEDY, use_tqdm=False, lora_request=lora)[0].outputs[0]
        got = out.outputs[0]
        assert got.token_ids == alone.token_ids
        assert [lp[t].logprob for lp, t in zip(got.logprobs, got.token_ids, strict=True)] == [
            lp[t].logprob for lp, t in zip(alone.logprobs, alone.token_ids, strict=True)
        ]
    # Four outputs per prompt, and they differ: each request got its own adapter.
    assert len({tuple(o.outputs[0].token_ids) for o in mixed[: len(loras)]}) == len(loras)


def test_max_loras_bounds_a_step_and_every_request_finishes(base_dirs, adapters) -> None:
    base = base_dirs("llama")
    llm = _llm(base, batch_invariant=True)
    one = LLM(
        str(base),
        enable_lora=True,
        max_loras=1,
        max_lora_rank=16,
        max_model_len=128,
        num_gpu_blocks_override=64,
        batch_invariant=True,
    )
    loras = [LoRARequest(n, i + 1, str(adapters("llama", n))) for i, n in enumerate(ADAPTERS)]
    want = llm.generate(PROMPTS * 3, GREEDY, use_tqdm=False, lora_request=loras * 2)
    got = one.generate(PROMPTS * 3, GREEDY, use_tqdm=False, lora_request=loras * 2)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
    assert one.llm_engine.engine_core.scheduler.running_loras() == []


def test_smollm2_adapter_equals_peft(default_model_dir: Path, tmp_path: Path) -> None:
    folder = make_adapter(
        default_model_dir,
        tmp_path / "smol",
        7,
        r=8,
        lora_alpha=16,
        target_modules=["q_proj", "v_proj", "down_proj"],
    )
    llm = LLM(
        str(default_model_dir),
        enable_lora=True,
        max_lora_rank=8,
        max_model_len=256,
        num_gpu_blocks_override=64,
    )
    params = SamplingParams(max_tokens=8, temperature=0.0, logprobs=0)
    lora = LoRARequest("smol", 1, str(folder))
    outs = llm.generate(PROMPTS, params, use_tqdm=False, lora_request=lora)
    refs = peft_references(default_model_dir, folder, PROMPTS, 8, merged=False)
    for prompt, out in zip(PROMPTS, outs, strict=True):
        check_output(out, refs[prompt])
