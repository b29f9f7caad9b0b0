"""Every supported architecture runs exactly as transformers does: tiny random
models of each, greedy tokens and the chosen tokens' logprobs against HF's own
``generate`` (eager attention, float32), at block sizes 16 and 8, under
preemption, with prefix caching, and past a sliding window; refused
architectures raise the clear error of ``model_support``.

Each model is built and its HF reference computed once per module. Where HF's
top-2 logits tie within ``TIE`` a different token is not a failure (the rest of
that output is then not compared).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from pagedrs import LLM, SamplingParams
from pagedrs.executor.kv_cache import KVCacheSpec
from pagedrs.executor.model_support import SUPPORTED_MODEL_TYPES
from reference import PROMPTS
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

MAX_TOKENS = 24
#: pagedrs' batched paged steps against HF's model run alone on each sequence:
#: other kernels and batch shapes, so not equal bits. The largest |dlogprob|
#: measured over every case and mode was 1.2e-5 (mixtral beyond its window,
#: Xeon with AMX, 2 cores); 1e-4 leaves ~8x for other CPUs' float32 rounding.
LOGPROB_TOL = 1e-4
TIE = 1e-4
WINDOW = 44  # the short prompts plus 24 tokens stay inside it; LONG goes past it
MAX_LEN = 128
BLOCKS = {"num_gpu_blocks_override": 64}  # a small pool builds fast

SHARED = "You are a helpful assistant. Answer in plain English."
SHORT = ["Name three rivers.", "The capital of France is"]
PREFIXED = [SHARED + " Name a river.", SHARED + " What is two plus two?"]
LONG = PROMPTS[3]  # 46 tokens: longer than WINDOW
ALL_PROMPTS = [*SHORT, *PREFIXED, LONG]

_COMMON: dict[str, Any] = {
    "vocab_size": 49152,  # the default model's tokenizer
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
}
_NO_GQA = {k: v for k, v in _COMMON.items() if k != "num_key_value_heads"}

#: case -> (model_type, config kwargs).
ZOO: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("llama", _COMMON),
    "llama3_rope": (
        "llama",
        {
            **_COMMON,
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 10000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
        },
    ),
    "mistral": ("mistral", {**_COMMON, "sliding_window": WINDOW}),
    "qwen2": (
        "qwen2",
        {**_COMMON, "use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 1},
    ),
    "qwen3": ("qwen3", {**_COMMON, "head_dim": 16}),
    "qwen3_moe": (
        "qwen3_moe",
        {
            **_COMMON,
            "head_dim": 16,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "decoder_sparse_step": 1,
        },
    ),
    "mixtral": ("mixtral", {**_COMMON, "num_local_experts": 4, "num_experts_per_tok": 2}),
    "qwen2_moe": (
        "qwen2_moe",
        {
            **_COMMON,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 64,
            "decoder_sparse_step": 1,
            "use_sliding_window": True,
            "sliding_window": WINDOW,
            "max_window_layers": 1,
        },
    ),
    "gemma": ("gemma", {**_COMMON, "head_dim": 16}),
    "gemma2": (
        "gemma2",
        {**_COMMON, "head_dim": 16, "sliding_window": WINDOW, "query_pre_attn_scalar": 16},
    ),
    "gemma3_text": (
        "gemma3_text",
        {
            **_COMMON,
            "head_dim": 16,
            "sliding_window": WINDOW,
            "query_pre_attn_scalar": 16,
            "final_logit_softcapping": 30.0,
        },
    ),
    "phi3": ("phi3", {**_COMMON, "sliding_window": WINDOW}),
    "gpt2": (
        "gpt2",
        {
            "vocab_size": 49152,
            "n_embd": 64,
            "n_layer": 2,
            "n_head": 4,
            "n_positions": 256,
            "bos_token_id": 1,
            "eos_token_id": 2,
        },
    ),
    "opt": (
        "opt",
        {
            "vocab_size": 49152,
            "hidden_size": 64,
            "ffn_dim": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "max_position_embeddings": 256,
            "word_embed_proj_dim": 64,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "pad_token_id": 0,
        },
    ),
    "gpt_neox": ("gpt_neox", {**_NO_GQA, "rotary_pct": 0.5}),
    "starcoder2": ("starcoder2", {**_COMMON, "sliding_window": WINDOW}),
    "olmo2": ("olmo2", _COMMON),
    "granite": (
        "granite",
        {
            **_COMMON,
            "logits_scaling": 4.0,
            "embedding_multiplier": 2.0,
            "residual_multiplier": 0.5,
            "attention_multiplier": 0.3,
        },
    ),
    "cohere": ("cohere", {**_COMMON, "logit_scale": 0.5}),
    "stablelm": ("stablelm", {**_COMMON, "partial_rotary_factor": 0.5}),
    "gpt_oss": (
        "gpt_oss",
        {
            **_COMMON,
            "head_dim": 16,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "sliding_window": WINDOW,
            "layer_types": ["sliding_attention", "full_attention"],
        },
    ),
}


@dataclass
class Reference:
    """HF's greedy tokens and per-step float32 logits of one prompt."""

    tokens: list[int]
    logits: list[torch.Tensor]


@dataclass
class ZooModel:
    """A saved tiny model and HF's outputs on ``ALL_PROMPTS``."""

    folder: Path
    refs: dict[str, Reference]


def _build(case: str, root: Path, tokenizer_dir: Path) -> ZooModel:
    model_type, kwargs = ZOO[case]
    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, **kwargs)
    config.initializer_range = 0.2  # peaked logits: greedy ties are rare
    folder = root / case
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(folder)
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    tok.save_pretrained(folder)
    hf = AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    refs = {}
    for prompt in ALL_PROMPTS:
        ids = tok(prompt, return_tensors="pt").input_ids
        out = hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=MAX_TOKENS,
            do_sample=False,
            pad_token_id=0,
            output_logits=True,
            return_dict_in_generate=True,
        )
        tokens = out.sequences[0, ids.shape[1] :].tolist()
        refs[prompt] = Reference(tokens, [lg[0].float() for lg in out.logits])
    return ZooModel(folder, refs)


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    """One torch thread: these matmuls are tiny, and a second thread only
    spin-waits when the 2 cores are shared."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def zoo(
    tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path
) -> Callable[[str], ZooModel]:
    """``zoo(case)``: the case's model, built once for the module."""
    root = tmp_path_factory.mktemp("zoo")
    built: dict[str, ZooModel] = {}

    def get(case: str) -> ZooModel:
        if case not in built:
            built[case] = _build(case, root, default_model_dir)
        return built[case]

    return get


def _check(llm: LLM, model: ZooModel, prompts: list[str]) -> None:
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, logprobs=0)
    outs = llm.generate(prompts, params, use_tqdm=False)
    for prompt, out in zip(prompts, outs, strict=True):
        ref = model.refs[prompt]
        got = out.outputs[0]
        for step, want in enumerate(ref.tokens):
            logits = ref.logits[step]
            if step >= len(got.token_ids) or got.token_ids[step] != want:
                top2 = logits.topk(2).values
                assert float(top2[0] - top2[1]) < TIE, (
                    f"{prompt!r}: token {step} is {got.token_ids[step : step + 1]}, HF {want}"
                    f" (HF {ref.tokens}, got {got.token_ids})"
                )
                break
            hf_logprob = float(logits.log_softmax(-1)[want])
            assert got.logprobs is not None
            ours = got.logprobs[step][want].logprob
            assert ours == pytest.approx(hf_logprob, abs=LOGPROB_TOL), (
                f"{prompt!r}: logprob of token {step}"
            )
        else:
            assert len(got.token_ids) == len(ref.tokens)
    stats = llm.kv_cache_stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"]


MODES = ("block16", "block8", "preempted", "prefix_cached", "beyond_window")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", list(ZOO))
def test_zoo_matches_hf(zoo: Callable[[str], ZooModel], case: str, mode: str) -> None:
    model = zoo(case)
    path = str(model.folder)
    if mode in ("block16", "block8"):
        llm = LLM(path, block_size=int(mode[5:]), max_model_len=MAX_LEN, **BLOCKS)
        _check(llm, model, [*SHORT, *PREFIXED])
    elif mode == "preempted":
        # 6 blocks of 8 tokens per KV cache group for 4 prompts of up to 17 + 24
        # tokens (inside the window: every group holds every token).
        groups = KVCacheSpec.from_config(AutoConfig.from_pretrained(path), 8, torch.float32).groups
        blocks = 6 * len(groups)
        llm = LLM(path, block_size=8, num_gpu_blocks_override=blocks, max_model_len=48)
        _check(llm, model, [*SHORT, *PREFIXED])
        assert llm.kv_cache_stats()["num_preemptions"] > 0
    elif mode == "prefix_cached":
        llm = LLM(path, block_size=8, max_model_len=MAX_LEN, enable_prefix_caching=True, **BLOCKS)
        _check(llm, model, PREFIXED[:1])
        _check(llm, model, [PREFIXED[1], *SHORT, PREFIXED[0]])
        assert llm.kv_cache_stats()["prefix_cache_hits"] > 0
    else:
        llm = LLM(path, block_size=16, max_model_len=MAX_LEN, **BLOCKS)
        _check(llm, model, [LONG, SHORT[0]])


def test_zoo_covers_every_supported_type() -> None:
    assert {model_type for model_type, _ in ZOO.values()} == set(SUPPORTED_MODEL_TYPES)


def _save_config(folder: Path, model_type: str, tokenizer_dir: Path, **kwargs: Any) -> Path:
    """A folder holding only a config (and the tokenizer): refusal reads no weights."""
    AutoConfig.for_model(model_type, **kwargs).save_pretrained(folder)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(folder)
    return folder


@pytest.mark.parametrize(
    ("model_type", "kwargs", "message"),
    [
        ("bloom", {}, "'bloom' is not supported by pagedrs: ALiBi position biases"),
        ("mpt", {}, "'mpt' is not supported by pagedrs: ALiBi position biases"),
        ("falcon", {"alibi": True}, "'falcon' is not supported by pagedrs: ALiBi"),
        ("falcon", {}, "'falcon' is not supported by pagedrs: attention computed inside"),
        ("mamba", {}, "'mamba' is not supported by pagedrs: recurrent or state-space"),
        ("jamba", {}, "'jamba' is not supported by pagedrs: recurrent or state-space"),
        ("recurrent_gemma", {}, "'recurrent_gemma' is not supported by pagedrs: recurrent"),
        ("t5", {}, "'t5' is not supported by pagedrs: cross-attention / encoder-decoder"),
        ("gpt2", {"add_cross_attention": True}, "'gpt2' is not supported by pagedrs: cross-"),
        ("llava", {}, "'llava' is not supported by pagedrs: multimodal"),
        (
            "llama",
            {"rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0}},
            "'llama' is not supported by pagedrs: rope scaling that depends",
        ),
        ("bert", {}, "'bert' is not supported by pagedrs \\(supported: cohere, gemma"),
    ],
)
def test_refused_architectures(
    tmp_path: Path, default_model_dir: Path, model_type: str, kwargs: dict, message: str
) -> None:
    folder = _save_config(tmp_path / model_type, model_type, default_model_dir, **kwargs)
    with pytest.raises(ValueError, match=f"model type {message}"):
        LLM(str(folder))


def test_remote_code_is_refused(tmp_path: Path, default_model_dir: Path) -> None:
    folder = _save_config(tmp_path / "remote", "llama", default_model_dir)
    config = json.loads((folder / "config.json").read_text())
    config["model_type"] = "my_llama"
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_my_llama.MyLlamaForCausalLM"}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="'my_llama' is not supported by pagedrs: custom model"):
        LLM(str(folder))
