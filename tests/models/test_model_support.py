"""The support table (``executor/model_support.py``): README's copy, logit
transforms against transformers' formulas, tensor-parallel refusals, and Hub ids
resolved through huggingface_hub's cache offline."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from pagedrs import LLM, SamplingParams
from pagedrs.engine.arg_utils import EngineArgs
from pagedrs.engine.core.setup import build_executor
from pagedrs.executor.model_support import (
    TENSOR_PARALLEL_MODEL_TYPES,
    check_tensor_parallel,
    logits_transform,
    refused_feature,
)
from reference import PROMPTS
from transformers import AutoConfig

README = Path(__file__).resolve().parents[2] / "README.md"


def test_logits_transforms_follow_transformers() -> None:
    x = torch.randn(3, 11) * 40
    granite = AutoConfig.for_model("granite", logits_scaling=4.0)
    cohere = AutoConfig.for_model("cohere", logit_scale=0.25)
    gemma2 = AutoConfig.for_model("gemma2", final_logit_softcapping=30.0)
    for config, want in [
        (granite, x / 4.0),
        (cohere, x * 0.25),
        (gemma2, torch.tanh(x / 30.0) * 30.0),
    ]:
        transform = logits_transform(config)
        assert transform is not None
        torch.testing.assert_close(transform(x), want)
    assert logits_transform(AutoConfig.for_model("llama")) is None
    assert logits_transform(AutoConfig.for_model("gemma2", final_logit_softcapping=None)) is None


def test_supported_features_are_not_refused() -> None:
    for config in [
        AutoConfig.for_model("mistral", sliding_window=16),
        AutoConfig.for_model("gemma2"),
        AutoConfig.for_model("gpt_oss"),
        AutoConfig.for_model("llama", rope_parameters={"rope_type": "linear", "factor": 2.0}),
    ]:
        assert refused_feature(config) is None, config.model_type


def test_tensor_parallel_refuses_other_architectures(tiny_model_dir: Path) -> None:
    for model_type in TENSOR_PARALLEL_MODEL_TYPES:
        check_tensor_parallel(AutoConfig.for_model(model_type), 2)
    message = "model type 'gpt2' cannot run with tensor_parallel_size=2"
    with pytest.raises(ValueError, match=message):
        check_tensor_parallel(AutoConfig.for_model("gpt2"), 2)

    class _Model:
        config = AutoConfig.for_model("gemma2")

    args = EngineArgs(model=str(tiny_model_dir), tensor_parallel_size=2)
    with pytest.raises(ValueError, match="'gemma2' cannot run with tensor_parallel_size=2"):
        build_executor(args, _Model(), None, 1, 0, 16)  # type: ignore[arg-type]


def _hub_cache(root: Path, repo: str, model_dir: Path, commit: str = "a" * 40) -> Path:
    """``root`` laid out as huggingface_hub's cache holding ``model_dir`` as ``repo``."""
    org, name = repo.split("/")
    repo_dir = root / f"models--{org}--{name}"
    shutil.copytree(model_dir, repo_dir / "snapshots" / commit)
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text(commit)
    return root


def test_hub_id_resolves_offline_from_the_cache(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = _hub_cache(tmp_path / "hub", "tiny-org/tiny-llama", tiny_model_dir)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    params = SamplingParams(max_tokens=8, temperature=0.0)
    by_id = LLM("tiny-org/tiny-llama", num_gpu_blocks_override=64, max_model_len=128)
    by_dir = LLM(str(tiny_model_dir), num_gpu_blocks_override=64, max_model_len=128)
    want = [o.outputs[0].token_ids for o in by_dir.generate(PROMPTS[:3], params)]
    assert [o.outputs[0].token_ids for o in by_id.generate(PROMPTS[:3], params)] == want
    with pytest.raises(ValueError, match="unknown model 'tiny-org/missing'"):
        LLM("tiny-org/missing")
    with pytest.raises(ValueError, match="unknown model 'tiny-org/tiny-llama'"):
        LLM("tiny-org/tiny-llama", revision="v9")


def test_hub_download_dir_wins_over_the_environment(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = _hub_cache(tmp_path / "mine", "tiny-org/tiny-llama", tiny_model_dir)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "elsewhere"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    llm = LLM("tiny-org/tiny-llama", download_dir=str(cache), num_gpu_blocks_override=64)
    out = llm.generate(["Hi"], SamplingParams(max_tokens=3, temperature=0.0))
    assert len(out[0].outputs[0].token_ids) == 3
