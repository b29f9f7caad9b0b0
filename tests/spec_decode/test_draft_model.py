"""``speculative_config`` method ``draft_model``: a second model drafts K
tokens per step, its KV in a KV cache group of its own in the target's pool.

* draft = target (the GGUF model itself): every draft is accepted, greedy and
  sampling (p = q), and the outputs equal speculation off; again on prefix
  cache hits (the cached blocks hold the draft's KV of every verified token);
* a random tiny draft (a LlamaForCausalLM of the target's vocabulary and page
  shape): greedy outputs equal speculation off on every request, with
  chunked prefill and preemption by recompute and by swap, every block back
  in the pool at the end;
* seeded sampling with a draft model repeats run to run;
* bad drafts raise ``ValueError`` naming ``speculative_config.model``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from pagedrs import LLM, SamplingParams
from spec_engines import PROMPTS, engine, smol_gguf, spec_stats
from transformers import AutoConfig, AutoModelForCausalLM

GREEDY = SamplingParams(max_tokens=24, temperature=0.0, logprobs=2)
K = 3


def _tiny_llama(folder: Path, *, vocab: int = 49152, kv_heads: int = 3, seed: int = 0) -> str:
    """A random-weights LlamaForCausalLM saved to ``folder``: 2 layers, the
    default model's page shape (3 KV heads of 64) unless told."""
    cfg = AutoConfig.for_model(
        "llama",
        vocab_size=vocab,
        hidden_size=192,
        num_attention_heads=3,
        num_key_value_heads=kv_heads,
        head_dim=64,
        num_hidden_layers=2,
        intermediate_size=256,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(folder)
    return str(folder)


def _draft(model: str, **extra: Any) -> dict[str, Any]:
    return {"method": "draft_model", "model": model, "num_speculative_tokens": K, **extra}


def _result(outs: list[Any]) -> list[tuple[Any, ...]]:
    """Per request: token ids, finish reason, text, logprob entries."""
    return [
        (
            i,
            list(c.token_ids),
            c.finish_reason,
            c.text,
            None
            if c.logprobs is None
            else [{t: (lp.logprob, lp.rank) for t, lp in pos.items()} for pos in c.logprobs],
        )
        for i, o in enumerate(outs)
        for c in o.outputs
    ]


def _delta(after: dict[str, Any], before: dict[str, Any], key: str) -> int:
    return int(after[f"spec_decode_num_{key}"] - before[f"spec_decode_num_{key}"])


@pytest.fixture(scope="module")
def tiny_draft(tmp_path_factory: pytest.TempPathFactory) -> str:
    return _tiny_llama(tmp_path_factory.mktemp("draft"))


@pytest.fixture(scope="module")
def reference(off: LLM) -> list[tuple[Any, ...]]:
    return _result(off.generate(PROMPTS, GREEDY, use_tqdm=False))


@pytest.fixture(scope="module")
def self_draft() -> Iterator[LLM]:
    llm = engine(_draft(str(smol_gguf())))
    yield llm
    llm.llm_engine.shutdown()


@pytest.fixture(scope="module")
def tiny(tiny_draft: str) -> Iterator[LLM]:
    """Fixed draft lengths: under ``"goodput"`` a draft's length follows the
    engine's acceptance so far, so a second run drafts differently."""
    llm = engine(_draft(tiny_draft, draft_length_policy="fixed"))
    yield llm
    llm.llm_engine.shutdown()


def test_draft_equal_to_target_accepts_every_draft(
    self_draft: LLM, reference: list[tuple[Any, ...]]
) -> None:
    """Greedy: every draft accepted, outputs equal; the same prompts again
    hit the prefix cache and still accept every draft."""
    core = self_draft.llm_engine.engine_core
    assert core.kv_spec.groups[-1].layers == tuple(range(30, 60))  # the draft's group
    for run in range(2):
        before = spec_stats(self_draft)
        hits = self_draft.llm_engine.kv_cache_stats()["prefix_cache_hits"]
        outs = self_draft.generate(PROMPTS, GREEDY, use_tqdm=False)
        after = spec_stats(self_draft)
        assert _result(outs) == reference
        drafted = _delta(after, before, "draft_tokens")
        assert drafted > 0
        assert _delta(after, before, "accepted_tokens") == drafted
        if run == 1:
            assert self_draft.llm_engine.kv_cache_stats()["prefix_cache_hits"] > hits
    assert self_draft.llm_engine.kv_cache_stats()["num_used_blocks"] == 0


def test_sampling_with_draft_equal_to_target(self_draft: LLM) -> None:
    """Sampling rows (temperature, top-p, top-k; seeded): the draft's q is the
    target's p, so the rejection rule accepts every draft; a seeded request
    gives the same tokens run to run."""
    params = [
        SamplingParams(max_tokens=20, temperature=0.8, top_p=0.95, seed=21 + i, top_k=50)
        for i in range(4)
    ]
    before = spec_stats(self_draft)
    first = [list(o.outputs[0].token_ids) for o in self_draft.generate(PROMPTS[:4], params)]
    after = spec_stats(self_draft)
    drafted = _delta(after, before, "draft_tokens")
    assert drafted > 0 and _delta(after, before, "accepted_tokens") == drafted
    again = [list(o.outputs[0].token_ids) for o in self_draft.generate(PROMPTS[:4], params)]
    assert again == first


def test_tiny_draft_greedy_equal_on_every_request(
    tiny: LLM, reference: list[tuple[Any, ...]]
) -> None:
    before = spec_stats(tiny)
    outs = tiny.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert _result(outs) == reference
    assert _delta(spec_stats(tiny), before, "draft_tokens") > 0
    assert sum(o.metrics.spec_num_draft_tokens for o in outs) > 0
    assert tiny.llm_engine.kv_cache_stats()["num_used_blocks"] == 0


def test_tiny_draft_seeded_sampling_repeats(tiny: LLM) -> None:
    """Seeded sampling through the rejection rule (the tiny draft's q is far
    from p: drafts are rejected and corrected) repeats run to run with the
    same draft lengths; penalties and min_tokens apply to the target's p."""
    params = [
        SamplingParams(max_tokens=20, temperature=1.0, seed=3),
        SamplingParams(max_tokens=20, temperature=0.7, seed=4, repetition_penalty=1.2),
        SamplingParams(max_tokens=20, temperature=0.9, seed=5, min_tokens=10, logprobs=1),
    ]
    first = _result(tiny.generate(PROMPTS[:3], params, use_tqdm=False))
    assert _result(tiny.generate(PROMPTS[:3], params, use_tqdm=False)) == first
    assert all(len(r[1]) >= 10 for r in first[2:])


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption_with_a_draft_model(
    mode: str, tiny_draft: str, reference: list[tuple[Any, ...]]
) -> None:
    """A token budget of 32 (chunked prefill, drafts counted in it) and 28
    blocks for 8 sequences of up to 10 blocks in each of two groups (target
    and draft): sequences are preempted with drafts in flight; outputs equal,
    every block back in the pool."""
    llm = engine(
        _draft(tiny_draft),
        num_gpu_blocks_override=28,
        max_num_batched_tokens=32,
        preemption_mode=mode,
        swap_space=0.1,
    )
    try:
        outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
        stats = llm.llm_engine.kv_cache_stats()
        assert _result(outs) == reference
        assert stats["num_preemptions"] > 0
        if mode == "swap":
            assert stats["num_swapped_out"] > 0
        assert stats["spec_decode_num_draft_tokens"] > 0
        assert stats["num_used_blocks"] == 0
    finally:
        llm.llm_engine.shutdown()


def test_bad_draft_models_name_the_field(tmp_path: Path) -> None:
    """Vocabulary or page shape other than the target's, an unknown model:
    ``ValueError`` naming ``speculative_config.model``, before any engine
    runs."""
    target = _tiny_llama(tmp_path / "target", vocab=512)
    cases = [
        (
            _tiny_llama(tmp_path / "vocab", vocab=500),
            r"has a vocabulary of 500 tokens, the target 512",
        ),
        (_tiny_llama(tmp_path / "heads", vocab=512, kv_heads=1), r"has 1 KV heads of size 64"),
        (str(tmp_path / "missing"), r"cannot be loaded"),
    ]
    for model, match in cases:
        with pytest.raises(ValueError, match=r"speculative_config\.model .*" + match):
            LLM(target, speculative_config=_draft(model), kv_cache_memory_bytes=8 << 20)
