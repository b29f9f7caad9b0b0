"""pagedrs' own code for each family it runs natively (``executor/models``:
Mistral and Qwen2 with sliding windows, Qwen3, Gemma, Gemma 2, Gemma 3,
Phi-3, Qwen3-MoE with a dense layer among the sparse ones, Qwen2-MoE with its
shared expert), on tiny random models of each (``AutoConfig.for_model``): greedy
tokens and their logprobs against transformers' own ``generate`` (eager
attention, float32), the same as HF's modules through the engine (prompt
logprobs included, prompts split into chunks), and each layer's attention
settings (scale, window, soft cap) equal to those HF's modules pass.
(Float and GGUF files of the families: ``test_gguf_archs.py``.)"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from pagedrs import LLM, SamplingParams
from pagedrs.attention.forward_context import ForwardContext, set_forward_context
from pagedrs.attention.hf_attention import ATTN_IMPLEMENTATION, register
from pagedrs.executor.kv_cache import layer_sliding_windows
from pagedrs.executor.models import (
    NATIVE_MODELS,
    PagedDecoderModel,
    PagedGemmaModel,
    PagedLlamaModel,
    PagedPhi3Model,
    PagedQwen2MoeModel,
    PagedQwen3Model,
    PagedQwen3MoeModel,
    native_model,
)
from reference import PROMPTS
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

MAX_TOKENS = 12
#: As ``test_model_zoo`` (HF's generate) and ``test_native_model`` (HF's
#: modules through the engine, prompt logprobs included).
LOGPROB_TOL = 1e-4
ENGINE_TOL = 2e-4
TIE = 1e-4
WINDOW = 16  # PROMPTS[3] (46 tokens) and the outputs go past it
#: Mixtures of experts: 4 experts, 2 per token (the cases without a window).
_MOE: dict[str, Any] = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64}
MOE_CASES = ("qwen3_moe", "qwen2_moe")

_COMMON: dict[str, Any] = {
    "vocab_size": 49152,  # the default model's tokenizer
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "tie_word_embeddings": False,
    "initializer_range": 0.2,
}

#: case -> (model_type, config kwargs, native class).
CASES: dict[str, tuple[str, dict[str, Any], type[PagedDecoderModel]]] = {
    "mistral": ("mistral", {**_COMMON, "sliding_window": WINDOW}, PagedLlamaModel),
    "qwen2": (
        "qwen2",
        {**_COMMON, "use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 2},
        PagedLlamaModel,
    ),
    "qwen3": ("qwen3", {**_COMMON, "head_dim": 16, "attention_bias": True}, PagedQwen3Model),
    "gemma": ("gemma", {**_COMMON, "head_dim": 16}, PagedGemmaModel),
    "gemma2": (
        "gemma2",
        {
            **_COMMON,
            "head_dim": 16,
            "sliding_window": WINDOW,
            "query_pre_attn_scalar": 24,
            "attn_logit_softcapping": 2.0,  # small: the cap changes the softmax
            "final_logit_softcapping": 5.0,
        },
        PagedGemmaModel,
    ),
    "gemma3_text": (
        "gemma3_text",
        {
            **_COMMON,
            "head_dim": 16,
            "sliding_window": WINDOW,
            "sliding_window_pattern": 2,  # local, global, local, global
            "query_pre_attn_scalar": 24,
            "rope_parameters": {
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "rope_theta": 1e6, "factor": 8.0},
            },
        },
        PagedGemmaModel,
    ),
    "phi3": (
        "phi3",
        {**_COMMON, "sliding_window": WINDOW, "partial_rotary_factor": 0.5},
        PagedPhi3Model,
    ),
    "qwen3_moe": (
        "qwen3_moe",
        {**_COMMON, **_MOE, "head_dim": 16, "norm_topk_prob": True, "mlp_only_layers": [1]},
        PagedQwen3MoeModel,
    ),
    "qwen2_moe": (
        "qwen2_moe",
        {**_COMMON, **_MOE, "shared_expert_intermediate_size": 96, "norm_topk_prob": False},
        PagedQwen2MoeModel,
    ),
}


@dataclass
class Family:
    """A saved tiny model and HF generate's tokens and logits per prompt."""

    case: str
    folder: Path
    refs: dict[str, tuple[list[int], list[torch.Tensor]]]


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _config(case: str) -> Any:
    model_type, kwargs, _ = CASES[case]
    return AutoConfig.for_model(model_type, **kwargs)


@pytest.fixture(scope="module")
def family(
    tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path
) -> Callable[[str], Family]:
    built: dict[str, Family] = {}
    tok = AutoTokenizer.from_pretrained(default_model_dir)

    def get(case: str) -> Family:
        if case in built:
            return built[case]
        torch.manual_seed(0)
        folder = tmp_path_factory.mktemp(case)
        hf = AutoModelForCausalLM.from_config(
            _config(case), dtype=torch.float32, attn_implementation="eager"
        ).eval()
        hf.save_pretrained(folder)
        tok.save_pretrained(folder)
        refs = {}
        for prompt in PROMPTS:
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
            refs[prompt] = (tokens, [lg[0].float() for lg in out.logits])
        built[case] = Family(case, folder, refs)
        return built[case]

    return get


def _generate(folder: Path, impl: str, **kwargs: Any) -> list:
    llm = LLM(
        model=str(folder),
        model_impl=impl,
        block_size=8,
        max_model_len=128,
        num_gpu_blocks_override=96,
        **kwargs,
    )
    native = llm.llm_engine.engine_core.runner.native
    assert (native is not None) == (impl == "pagedrs")
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, logprobs=3, prompt_logprobs=3)
    return llm.generate(PROMPTS, params, use_tqdm=False)


@pytest.mark.parametrize("case", list(CASES))
def test_native_family_matches_hf_generate(family: Callable[[str], Family], case: str) -> None:
    fam = family(case)
    llm = LLM(model=str(fam.folder), block_size=8, max_model_len=128, num_gpu_blocks_override=96)
    # "auto" picks the family's own code.
    assert type(llm.llm_engine.engine_core.runner.native) is CASES[case][2]
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, logprobs=0)
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    for prompt, out in zip(PROMPTS, outs, strict=True):
        want, logits = fam.refs[prompt]
        got = out.outputs[0]
        for step, token in enumerate(want):
            if step >= len(got.token_ids) or got.token_ids[step] != token:
                top2 = logits[step].topk(2).values
                assert float(top2[0] - top2[1]) < TIE, (
                    f"{case} {prompt!r}: token {step}: got {got.token_ids}, HF {want}"
                )
                break
            assert got.logprobs is not None
            hf_logprob = float(logits[step].log_softmax(-1)[token])
            ours = got.logprobs[step][token].logprob
            assert ours == pytest.approx(hf_logprob, abs=LOGPROB_TOL), f"{case} step {step}"
        else:
            assert len(got.token_ids) == len(want)


@pytest.mark.parametrize("case", list(CASES))
def test_native_family_equals_hf_modules(family: Callable[[str], Family], case: str) -> None:
    """Chunked prompts (16-token budget) mixed with decodes; prompt logprobs too."""
    folder = family(case).folder
    a = _generate(folder, "pagedrs", max_num_batched_tokens=16)
    b = _generate(folder, "transformers", max_num_batched_tokens=16)
    for x, y in zip(a, b, strict=True):
        assert x.outputs[0].token_ids == y.outputs[0].token_ids
        for lx, ly in zip(x.outputs[0].logprobs, y.outputs[0].logprobs, strict=True):
            assert lx.keys() == ly.keys()
            for tok in lx:
                assert lx[tok].logprob == pytest.approx(ly[tok].logprob, abs=ENGINE_TOL)
        for lx, ly in zip(x.prompt_logprobs[1:], y.prompt_logprobs[1:], strict=True):
            for tok in set(lx) & set(ly):
                assert lx[tok].logprob == pytest.approx(ly[tok].logprob, abs=ENGINE_TOL)


class _Recorder:
    """An attention backend stand-in that records each call's options."""

    def __init__(self) -> None:
        self.options: list[Any] = []

    def forward(self, q, k, v, key_cache, value_cache, meta, options):
        self.options.append(options)
        return torch.zeros_like(q)


@pytest.mark.parametrize("case", list(CASES))
def test_native_attention_options_are_hf_modules(case: str) -> None:
    """Scale, sliding window and soft cap of each layer: the native model's
    equal what HF's modules pass to the attention function."""
    register()
    torch.manual_seed(0)
    config = _config(case)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=ATTN_IMPLEMENTATION)
    n = config.num_hidden_layers
    ids = torch.arange(5)
    hf_rec, native_rec = _Recorder(), _Recorder()
    caches = [(torch.zeros(1), torch.zeros(1))] * n
    ctx = ForwardContext(caches, [None] * n, hf_rec, [0] * n, [None])  # type: ignore[list-item]
    with set_forward_context(ctx), torch.no_grad():
        model.get_decoder()(input_ids=ids[None], position_ids=ids[None], use_cache=False)
    native_model(model, 16).forward(ids, ids, [None], caches, native_rec)  # type: ignore[list-item]
    assert native_rec.options == hf_rec.options
    windows = [o.sliding_window for o in native_rec.options]
    assert windows == layer_sliding_windows(config)
    assert any(w == WINDOW for w in windows) == (case not in ("qwen3", "gemma", *MOE_CASES))
    if case == "gemma2":
        assert {o.softcap for o in native_rec.options} == {2.0}
        assert {o.scale for o in native_rec.options} == {24**-0.5}


def test_every_native_type_has_a_case() -> None:
    covered = {model_type for model_type, *_ in CASES.values()} | {"llama"}  # test_native_model
    assert covered == set(NATIVE_MODELS)


def test_layer_in_a_group_of_another_window_is_refused() -> None:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(_config("gemma2"))
    with pytest.raises(ValueError, match="layer 1 attends with sliding_window=None.*group 0"):
        native_model(model, 16, layer_groups=[0, 0, 0, 0], group_windows=[WINDOW])


def test_lora_refused_on_fused_checkpoint_projections(family: Callable[[str], Family]) -> None:
    """Phi-3 stores q/k/v fused (``qkv_proj``): LoRA's q_proj/k_proj/v_proj
    targets are refused by name, as with HF's modules."""
    folder = family("phi3").folder
    with pytest.raises(ValueError, match=r"enable_lora: decoder layer 0 has no self_attn\.q_proj"):
        LLM(model=str(folder), enable_lora=True, max_model_len=128, num_gpu_blocks_override=32)


def test_lora_refused_on_sparse_layers(family: Callable[[str], Family]) -> None:
    """A mixture of experts has no dense gate/up projection to adapt."""
    folder = family("qwen3_moe").folder
    with pytest.raises(ValueError, match=r"enable_lora: decoder layer 0 has no mlp\.gate_proj"):
        LLM(model=str(folder), enable_lora=True, max_model_len=128, num_gpu_blocks_override=32)


def test_more_experts_per_token_than_experts_is_refused(tmp_path: Path) -> None:
    """A config routing each token to more experts than it has is refused at
    load, naming both keys (HF's modules fail at the first step)."""
    torch.manual_seed(0)
    config = AutoConfig.for_model("qwen3_moe", **{**_COMMON, **_MOE, "num_experts_per_tok": 6})
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"num_experts_per_tok=6 is more than num_experts=4"):
        LLM(model=str(tmp_path), max_model_len=64, num_gpu_blocks_override=16)
