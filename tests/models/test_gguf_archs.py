"""Every GGUF architecture of ``gguf_archs.GGUF_ARCHS`` from a file this test
writes (``gguf_writer``: a tiny random HF model laid out as llama.cpp's
converter lays it out, projections in Q4_0 / Q8_0 / Q4_K / Q6_K), loaded with
its projections kept quantized (run by pagedrs' own model code where the
family has one, ``executor.models.NATIVE_MODELS``), against transformers on
the file's dequantized weights: greedy tokens equal and each chosen token's logprob
within ``LOGPROB_TOL`` through the whole engine (paged attention); and the
refusals, by name."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import torch
from gguf_writer import write_gguf
from pagedrs import LLM, SamplingParams
from pagedrs.executor.models import NATIVE_MODELS
from pagedrs.executor.quant.experts import QuantizedExperts
from pagedrs.executor.quant.gguf_archs import GGUF_ARCHS, GGUFLoadError, read_config
from pagedrs.executor.quant.gguf_loader import load_gguf_quantized
from pagedrs.executor.quant.modules import QuantizedEmbedding, QuantizedLinearModule
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

MAX_TOKENS = 8
#: The quantized kernels' activation rounding (int16 per 32 values) moves
#: logits by ~1e-3 (``test_quantized_gguf.test_int8_model_matches_reference_math``'s
#: 2e-3 bound on logits); logprobs are held to the same bound. The largest
#: |dlogprob| measured against HF (batched paged steps vs HF's model alone) was
#: 4.6e-4 (mistral, Xeon with AMX, 2 cores): 2e-3 leaves ~4x.
LOGPROB_TOL = 2e-3
TIE = 2e-3
PROMPTS = ["The capital of France is", "Name three rivers of Europe and their lengths."]

_COMMON: dict[str, Any] = {
    "vocab_size": 49152,  # the default model's tokenizer
    "hidden_size": 256,  # K types need rows of 256 values
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
    "initializer_range": 0.1,
}
_MOE = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 256}

#: case -> (GGUF architecture, HF model type, config kwargs, main type, wide type).
CASES: dict[str, tuple[str, str, dict[str, Any], str, str]] = {
    "llama": ("llama", "llama", {**_COMMON, "tie_word_embeddings": True}, "Q4_0", "Q8_0"),
    "llama3_rope": (
        "llama",
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
        "Q8_0",
        "Q4_0",
    ),
    "mistral": ("llama", "mistral", {**_COMMON, "sliding_window": None}, "Q4_K", "Q6_K"),
    "qwen2": ("qwen2", "qwen2", _COMMON, "Q8_0", "Q4_0"),
    "qwen3": ("qwen3", "qwen3", {**_COMMON, "head_dim": 64}, "Q4_K", "Q6_K"),
    "qwen2moe": (
        "qwen2moe",
        "qwen2_moe",
        {**_COMMON, **_MOE, "shared_expert_intermediate_size": 512},
        "Q4_K",
        "Q8_0",
    ),
    "qwen3moe": (
        "qwen3moe",
        "qwen3_moe",
        {**_COMMON, **_MOE, "head_dim": 64, "norm_topk_prob": True},  # as Qwen3's MoE files
        "Q4_0",
        "Q6_K",
    ),
    "phi3": ("phi3", "phi3", {**_COMMON, "pad_token_id": 0}, "Q4_K", "Q6_K"),
    "gemma2": (
        "gemma2",
        "gemma2",
        {
            **_COMMON,
            "head_dim": 64,
            "sliding_window": 16,
            "query_pre_attn_scalar": 64,
            "tie_word_embeddings": True,  # llama.cpp's gemma2 has no output tensor
        },
        "Q8_0",
        "Q6_K",
    ),
    "gemma3": (
        "gemma3",
        "gemma3_text",
        {**_COMMON, "head_dim": 64, "sliding_window": 16, "query_pre_attn_scalar": 64},
        "Q4_K",
        "Q8_0",
    ),
    "olmo2": ("olmo2", "olmo2", _COMMON, "Q4_0", "Q6_K"),
    "granite": (
        "granite",
        "granite",
        {
            **_COMMON,
            "logits_scaling": 4.0,
            "embedding_multiplier": 2.0,
            "residual_multiplier": 0.5,
            "attention_multiplier": 0.1,
        },
        "Q4_K",
        "Q4_0",
    ),
    "starcoder2": ("starcoder2", "starcoder2", _COMMON, "Q8_0", "Q4_K"),
}


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _write(case: str, folder: Path) -> tuple[Path, Any]:
    arch, model_type, kwargs, qtype, second = CASES[case]
    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, **kwargs)
    hf = AutoModelForCausalLM.from_config(
        config, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    path = folder / f"{case}.{qtype}.gguf"
    write_gguf(path, arch, hf, qtype, second)
    return path, hf


def test_cases_cover_every_architecture() -> None:
    assert {arch for arch, *_ in CASES.values()} == set(GGUF_ARCHS)


@pytest.mark.parametrize("case", list(CASES))
def test_gguf_arch_matches_hf(case: str, tmp_path: Path, default_model_dir: Path) -> None:
    path, hf = _write(case, tmp_path)
    config = read_config(path)
    assert config.model_type == hf.config.model_type or case == "mistral"

    # Kept quantized: every projection, the embeddings and the expert stacks.
    model = load_gguf_quantized(path, config, torch.float32)
    floats = [n for n, p in model.named_parameters() if p.dim() > 1]
    assert all(n.endswith("mlp.gate.weight") for n in floats), floats
    assert isinstance(model.get_input_embeddings(), QuantizedEmbedding)
    assert isinstance(model.get_output_embeddings(), QuantizedLinearModule)
    if GGUF_ARCHS[CASES[case][0]].experts:
        assert isinstance(model.model.layers[0].mlp.experts, QuantizedExperts)
    del model

    llm = LLM(
        model=str(path),
        tokenizer=str(default_model_dir),
        max_model_len=128,
        num_gpu_blocks_override=64,
        # The exact options: HF's float32 arithmetic on the dequantized weights.
        activation_quantization="int16",
        kv_cache_dtype="float32",
    )
    # The families with native code run it on the quantized projections.
    native = llm.llm_engine.engine_core.runner.native
    native_class = NATIVE_MODELS.get(hf.config.model_type)
    if native_class is None:
        assert native is None
    else:
        assert type(native) is native_class
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, logprobs=0)
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    tok = AutoTokenizer.from_pretrained(default_model_dir)
    for prompt, out in zip(PROMPTS, outs, strict=True):
        ids = tok(prompt, return_tensors="pt").input_ids
        ref = hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=MAX_TOKENS,
            do_sample=False,
            pad_token_id=0,
            output_logits=True,
            return_dict_in_generate=True,
        )
        want = ref.sequences[0, ids.shape[1] :].tolist()
        got = out.outputs[0]
        for step, token in enumerate(want):
            logits = ref.logits[step][0].float()
            if step >= len(got.token_ids) or got.token_ids[step] != token:
                top2 = logits.topk(2).values
                assert float(top2[0] - top2[1]) < TIE, (
                    f"{case} {prompt!r}: token {step}: got {got.token_ids}, HF {want}"
                )
                break
            assert got.logprobs is not None
            ours = got.logprobs[step][token].logprob
            hf_logprob = float(logits.log_softmax(-1)[token])
            assert ours == pytest.approx(hf_logprob, abs=LOGPROB_TOL), f"{case} step {step}"
        else:
            assert len(got.token_ids) == len(want)


def _tiny_file(path: Path, arch: str, **keys: Any) -> Path:
    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in keys.items():
        if isinstance(value, str):
            writer.add_string(f"{arch}.{key}", value)
        else:
            writer.add_uint32(f"{arch}.{key}", value)
    writer.add_tensor("token_embd.weight", np.zeros((8, 32), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_unsupported_architecture_refused_by_name(tmp_path: Path) -> None:
    path = _tiny_file(tmp_path / "rwkv.gguf", "rwkv6")
    with pytest.raises(GGUFLoadError, match=r"rwkv\.gguf: GGUF architecture 'rwkv6' is not"):
        read_config(path)


def test_missing_key_and_unsupported_rope_refused_by_name(tmp_path: Path) -> None:
    path = _tiny_file(tmp_path / "q.gguf", "qwen2", embedding_length=32)
    with pytest.raises(GGUFLoadError, match=r"'qwen2' needs qwen2\.attention\.head_count"):
        read_config(path)
    keys = {
        "embedding_length": 32,
        "block_count": 1,
        "attention.head_count": 2,
        "context_length": 64,
        "rope.scaling.type": "yarn",
    }
    path = _tiny_file(tmp_path / "y.gguf", "qwen2", **keys)
    with pytest.raises(GGUFLoadError, match=r"qwen2\.rope\.scaling\.type 'yarn'"):
        read_config(path)


def test_experts_run_once_per_step_for_all_their_tokens() -> None:
    """``QuantizedExperts``' per-expert loop calls each routed expert's
    projections once for all of its tokens; it and the one Rust call give
    the same bits and equal HF's experts loop on the dequantized stacks."""
    from pagedrs.executor.quant.weight import QuantizedWeight
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    e, inter, hidden, k, t = 4, 64, 64, 2, 9
    rng = np.random.default_rng(0)

    def stack(rows: int, cols: int) -> QuantizedWeight:
        values = rng.standard_normal((rows, cols), dtype=np.float32) * 0.1
        data = gguf.quants.quantize(values, gguf.GGMLQuantizationType.Q8_0)
        return QuantizedWeight("Q8_0", (rows, cols), torch.from_numpy(data))

    gate, up, down = stack(e * inter, hidden), stack(e * inter, hidden), stack(e * hidden, inter)
    ours = QuantizedExperts(gate, up, down, e, torch.nn.functional.silu)
    config = AutoConfig.for_model(
        "qwen3_moe", num_experts=e, moe_intermediate_size=inter, hidden_size=hidden
    )
    ref = Qwen3MoeExperts(config)
    with torch.no_grad():
        g, u = gate.dequantize().view(e, inter, hidden), up.dequantize().view(e, inter, hidden)
        ref.gate_up_proj.copy_(torch.cat([g, u], dim=1))
        ref.down_proj.copy_(down.dequantize().view(e, hidden, inter))
    x = torch.randn(t, hidden)
    index = torch.tensor([[0, 1], [1, 0], [2, 1], [1, 2], [0, 2], [2, 0], [1, 0], [0, 1], [2, 1]])
    weights = torch.rand(t, k)
    calls = []
    ours.gate_up = [_Counting(lin, i, calls) for i, lin in enumerate(ours.gate_up)]  # type: ignore[misc]
    with torch.no_grad():
        loop = ours.forward_per_expert(x, index, weights)
        got = ours(x, index, weights)
        want = ref(x, index, weights)
    assert sorted(calls) == [(0, 6), (1, 7), (2, 5)]  # expert 3 not routed: not run
    assert torch.equal(got, loop)
    torch.testing.assert_close(got, want, atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("case", ["qwen2moe", "qwen3moe"])
def test_moe_one_call_equals_the_per_expert_loop(
    case: str, tmp_path: Path, default_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A whole GGUF MoE model (Qwen2-MoE with its shared expert, Qwen3-MoE)
    through the engine, 16 sequences batched: the experts as one Rust call
    and as the per-expert loop give the same greedy tokens and the same
    logprobs bit for bit."""
    path, _ = _write(case, tmp_path)
    prompts = [f"{PROMPTS[i % 2]} {' '.join(['and'] * i)}" for i in range(16)]
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, logprobs=0)

    def run() -> list[tuple[list[int], list[float]]]:
        llm = LLM(
            model=str(path),
            tokenizer=str(default_model_dir),
            max_model_len=128,
            num_gpu_blocks_override=64,
            activation_quantization="int16",
            kv_cache_dtype="float32",
        )
        outs = llm.generate(prompts, params, use_tqdm=False)
        got = []
        for out in outs:
            o = out.outputs[0]
            assert o.logprobs is not None
            lps = [o.logprobs[i][t].logprob for i, t in enumerate(o.token_ids)]
            got.append((list(o.token_ids), lps))
        return got

    one_call = run()
    monkeypatch.setattr(QuantizedExperts, "forward", QuantizedExperts.forward_per_expert)
    assert run() == one_call


@pytest.mark.parametrize("case", ["qwen2moe", "qwen3moe"])
def test_moe_sequence_alone_equals_it_in_a_batch(
    case: str, tmp_path: Path, default_model_dir: Path
) -> None:
    """A GGUF MoE model with the engine's defaults (int8 activations, its
    native code): each sequence alone and among 16 gives the same tokens and
    logprobs bit for bit (router, experts and attention batch-invariant)."""
    path, _ = _write(case, tmp_path)
    prompts = [f"{PROMPTS[i % 2]} {' '.join(['and'] * i)}" for i in range(16)]
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, logprobs=0)
    llm = LLM(
        model=str(path),
        tokenizer=str(default_model_dir),
        max_model_len=128,
        num_gpu_blocks_override=128,
    )
    assert llm.llm_engine.engine_core.runner.native is not None

    def tokens_and_logprobs(outs: list[Any]) -> list[tuple[list[int], list[float]]]:
        got = []
        for out in outs:
            o = out.outputs[0]
            assert o.logprobs is not None
            got.append(
                (list(o.token_ids), [o.logprobs[i][t].logprob for i, t in enumerate(o.token_ids)])
            )
        return got

    batch = tokens_and_logprobs(llm.generate(prompts, params, use_tqdm=False))
    alone = [tokens_and_logprobs(llm.generate([p], params, use_tqdm=False))[0] for p in prompts]
    assert alone == batch


class _Counting:
    """A projection that records (expert, rows) of each call."""

    def __init__(self, lin: Any, expert: int, calls: list[tuple[int, int]]) -> None:
        self.lin, self.expert, self.calls = lin, expert, calls

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.append((self.expert, x.shape[0]))
        return type(self.lin).__call__(self.lin, x)


def test_expert_stacks_counted_in_weight_bytes(tmp_path: Path) -> None:
    """``weight_nbytes`` of a GGUF MoE: every quantized tensor's bytes in the
    file (expert stacks included) plus the float parameters and buffers."""
    from pagedrs.executor.quant.gguf_header import read_header
    from pagedrs.executor.quant.memory import weight_nbytes
    from pagedrs.executor.quant.weight import GGUF_BLOCK_TYPES

    path, _ = _write("qwen3moe", tmp_path)
    model = load_gguf_quantized(path, read_config(path), torch.float32)
    header = read_header(path)
    quantized = sum(t.n_bytes for t in header.tensors if t.type_name in GGUF_BLOCK_TYPES)
    floats = sum(p.numel() * p.element_size() for p in model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    assert weight_nbytes(model) == quantized + floats + buffers
