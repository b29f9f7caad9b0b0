"""llama.cpp GGUF LoRA adapter files (``general.type = adapter``): a PEFT
adapter written as llama.cpp's converter writes it runs exactly as its PEFT
folder (the same bits) and as transformers + peft (greedy tokens, logprobs
within the tolerance), on tiny llama (q/k rows interleaved), qwen2 and
gemma3_text models, on SmolLM2 and on SmolLM2's Q4_1 GGUF; F16 / BF16 / Q8_0
tensors are read as their values; files that do not fit are refused naming
the file and the key or tensor."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf_lora_file import interleave_rows, write_gguf_lora
from lora_models import ADAPTERS, BASES, build_base, check_output, make_adapter, peft_references
from pagedrs import LLM, LoRARequest, SamplingParams
from pagedrs.lora.adapter import LoRAError
from pagedrs.lora.loader import load_adapter
from pagedrs.lora.peft import load_peft_adapter
from transformers import AutoConfig

MAX_TOKENS = 16
PROMPTS = ["The capital of France is", "Name three rivers."]
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, logprobs=0)
#: GGUF has no rsLoRA (its scaling is alpha / r): the plain adapters.
PLAIN = ["attn-r8", "all-r16"]
SMOL_GGUF = Path.home() / ".cache" / "pagedrs" / "gguf" / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _gguf(peft_dir: Path, base_dir: Path, out: Path, qtype: str = "F32") -> Path:
    cfg = AutoConfig.from_pretrained(base_dir)
    kv = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    return write_gguf_lora(peft_dir, out, cfg.model_type, cfg.num_attention_heads, kv, qtype)


def _logprobs(out) -> list[float]:
    got = out.outputs[0]
    return [lp[t].logprob for lp, t in zip(got.logprobs, got.token_ids, strict=True)]


def _same(a, b) -> None:
    assert a.outputs[0].token_ids == b.outputs[0].token_ids
    assert _logprobs(a) == _logprobs(b)


@pytest.mark.parametrize("case", list(BASES))
def test_gguf_adapter_runs_as_its_peft_folder_and_as_peft(
    case: str, tmp_path: Path, default_model_dir: Path
) -> None:
    base = build_base(case, tmp_path / "base", default_model_dir)
    llm = LLM(
        str(base),
        enable_lora=True,
        max_loras=2,
        max_lora_rank=16,
        max_model_len=128,
        num_gpu_blocks_override=64,
    )
    for i, name in enumerate(PLAIN):
        folder = make_adapter(base, tmp_path / name, i + 1, **ADAPTERS[name])
        file = _gguf(folder, base, tmp_path / f"{name}.gguf")
        via_folder = llm.generate(
            PROMPTS, GREEDY, use_tqdm=False, lora_request=LoRARequest(name, 2 * i + 1, str(folder))
        )
        via_gguf = llm.generate(
            PROMPTS,
            GREEDY,
            use_tqdm=False,
            lora_request=LoRARequest(f"{name}-gguf", 2 * i + 2, str(file)),
        )
        refs = peft_references(base, folder, PROMPTS, MAX_TOKENS, merged=False)
        for prompt, a, b in zip(PROMPTS, via_folder, via_gguf, strict=True):
            _same(a, b)
            check_output(b, refs[prompt])
        # The matrices the engine runs are the PEFT folder's, q/k rows included.
        registry = llm.llm_engine.engine_core.lora.registry
        want, got = registry.get(2 * i + 1), registry.get(2 * i + 2)
        assert got.rank == want.rank and got.scaling == want.scaling
        assert set(got.weights) == set(want.weights)
        for key, w in want.weights.items():
            assert torch.equal(got.weights[key].lora_a, w.lora_a), key
            assert torch.equal(got.weights[key].lora_b, w.lora_b), key


@pytest.fixture(scope="module")
def smol_adapter(tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path):
    root = tmp_path_factory.mktemp("smol-gguf-lora")
    folder = make_adapter(
        default_model_dir,
        root / "peft",
        7,
        r=8,
        lora_alpha=16,
        target_modules=["q_proj", "k_proj", "v_proj", "down_proj"],
    )
    return folder, _gguf(folder, default_model_dir, root / "smol-lora.gguf")


def test_smollm2_gguf_adapter_equals_peft(default_model_dir: Path, smol_adapter) -> None:
    folder, file = smol_adapter
    llm = LLM(
        str(default_model_dir),
        enable_lora=True,
        max_lora_rank=8,
        max_model_len=256,
        num_gpu_blocks_override=64,
    )
    params = SamplingParams(max_tokens=8, temperature=0.0, logprobs=0)
    outs = llm.generate(
        PROMPTS, params, use_tqdm=False, lora_request=LoRARequest("s", 1, str(file))
    )
    refs = peft_references(default_model_dir, folder, PROMPTS, 8, merged=False)
    for prompt, out in zip(PROMPTS, outs, strict=True):
        check_output(out, refs[prompt])


@pytest.mark.skipif(not SMOL_GGUF.exists(), reason="SmolLM2 GGUF not cached")
def test_gguf_adapter_on_a_gguf_model_equals_its_peft_folder(smol_adapter) -> None:
    folder, file = smol_adapter
    llm = LLM(
        str(SMOL_GGUF),
        enable_lora=True,
        max_loras=2,
        max_lora_rank=8,
        max_model_len=256,
        num_gpu_blocks_override=64,
    )
    params = SamplingParams(max_tokens=8, temperature=0.0, logprobs=0)
    a = llm.generate(PROMPTS, params, use_tqdm=False, lora_request=LoRARequest("p", 1, str(folder)))
    b = llm.generate(PROMPTS, params, use_tqdm=False, lora_request=LoRARequest("g", 2, str(file)))
    for x, y in zip(a, b, strict=True):
        _same(x, y)
    base = llm.generate(PROMPTS[0], params, use_tqdm=False)[0]
    assert base.outputs[0].token_ids != b[0].outputs[0].token_ids


def test_f16_bf16_and_q8_0_tensors_are_read_as_their_values(
    smol_adapter, tmp_path: Path, default_model_dir: Path
) -> None:
    folder, _ = smol_adapter
    cfg = AutoConfig.from_pretrained(default_model_dir)
    want = load_peft_adapter(str(folder), 1, "p", 8)
    rounding = {
        "F16": lambda x: x.half().float(),
        "BF16": lambda x: x.bfloat16().float(),
        # Q8_0 rows of 576 values are whole 32-value blocks; lora_b's rows of
        # r = 8 are not, and are written as F16, as the converter does.
        "Q8_0": lambda x: torch.from_numpy(
            gguf.quants.dequantize(
                gguf.quants.quantize(x.numpy(), gguf.GGMLQuantizationType.Q8_0),
                gguf.GGMLQuantizationType.Q8_0,
            )
        ),
    }
    for qtype, rounded in rounding.items():
        file = _gguf(folder, default_model_dir, tmp_path / f"{qtype}.gguf", qtype)
        got = load_adapter(str(file), 1, "g", 8)
        assert got.gguf_arch == "llama" and got.rank == 8 and got.scaling == 2.0
        for (layer, module), w in want.weights.items():
            a = got.weights[(layer, module)].lora_a
            b = got.weights[(layer, module)].lora_b
            assert torch.equal(a, rounded(w.lora_a)), (qtype, layer, module)
            want_b = w.lora_b.half().float() if qtype == "Q8_0" else rounded(w.lora_b)
            if module in ("q_proj", "k_proj"):  # rows as the file holds them (interleaved)
                heads = cfg.num_attention_heads if module == "q_proj" else cfg.num_key_value_heads
                want_b = interleave_rows(want_b, heads)
            assert torch.equal(b, want_b), (qtype, layer, module)


def _write(path: Path, arch: str, meta: dict, tensors: dict[str, np.ndarray]) -> Path:
    w = gguf.GGUFWriter(str(path), arch)
    for key, value in meta.items():
        if isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_float32(key, value)
    for name, t in tensors.items():
        w.add_tensor(name, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


LORA = {"general.type": "adapter", "adapter.type": "lora", "adapter.lora.alpha": 16.0}


def _pair(name: str, r: int, k: int, n: int) -> dict[str, np.ndarray]:
    g = np.random.default_rng(0)
    return {
        f"{name}.lora_a": g.standard_normal((r, k)).astype(np.float32),
        f"{name}.lora_b": g.standard_normal((n, r)).astype(np.float32),
    }


def test_files_that_do_not_fit_are_refused_by_name(tmp_path: Path) -> None:
    q = "blk.0.attn_q.weight"

    def refused(path: Path, match: str, rank: int = 8) -> None:
        with pytest.raises(LoRAError, match=match) as e:
            load_adapter(str(path), 1, "x", rank)
        assert str(path) in str(e.value)

    truncated = tmp_path / "truncated.gguf"
    good = _write(tmp_path / "good.gguf", "llama", LORA, _pair(q, 4, 64, 64))
    truncated.write_bytes(good.read_bytes()[:-100])
    refused(truncated, "not a readable GGUF file")
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 40)
    refused(garbage, "not a readable GGUF file")
    refused(_write(tmp_path / "m.gguf", "llama", {}, _pair(q, 4, 64, 64)), "general.type is None")
    cvec = {**LORA, "adapter.type": "control_vector"}
    refused(_write(tmp_path / "c.gguf", "llama", cvec, _pair(q, 4, 64, 64)), "adapter.type")
    refused(_write(tmp_path / "u.gguf", "nosuch", LORA, _pair(q, 4, 64, 64)), "unknown to gguf-py")
    embd = _pair("token_embd.weight", 4, 64, 64)
    refused(_write(tmp_path / "e.gguf", "llama", LORA, embd), "'token_embd.weight' is not")
    norm = {**_pair(q, 4, 64, 64), "blk.0.attn_norm.weight": np.ones(64, np.float32)}
    refused(_write(tmp_path / "n.gguf", "llama", LORA, norm), "'blk.0.attn_norm.weight'.*norm")
    half = {f"{q}.lora_a": _pair(q, 4, 64, 64)[f"{q}.lora_a"]}
    refused(_write(tmp_path / "h.gguf", "llama", LORA, half), "'blk.0.attn_q.weight.lora_a'.*pair")
    transposed = {
        f"{q}.lora_a": np.zeros((64, 4), np.float32),
        f"{q}.lora_b": np.zeros((64, 4), np.float32),
    }
    refused(
        _write(tmp_path / "t.gguf", "llama", LORA, transposed), "not \\[r, in\\] and \\[out, r\\]"
    )
    wide = _write(tmp_path / "w.gguf", "llama", LORA, _pair(q, 16, 64, 64))
    refused(wide, "'blk.0.attn_q.weight.lora_a' has rank 16, over the engine's max_lora_rank=8")
    mixed = {**_pair(q, 4, 64, 64), **_pair("blk.0.attn_v.weight", 8, 64, 32)}
    refused(_write(tmp_path / "r.gguf", "llama", LORA, mixed), "rank 8, other tensors rank 4")
    ints = tmp_path / "i.gguf"
    w = gguf.GGUFWriter(str(ints), "llama")
    w.add_type("adapter")
    w.add_string("adapter.type", "lora")
    w.add_tensor(f"{q}.lora_a", np.zeros((4, 64), np.int32))
    w.add_tensor(f"{q}.lora_b", np.zeros((64, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    refused(ints, "'blk.0.attn_q.weight.lora_a' is of ggml type I32")
    # No alpha: llama.cpp's scaling of 1.
    no_alpha = {"general.type": "adapter", "adapter.type": "lora"}
    assert (
        load_adapter(
            str(_write(tmp_path / "a.gguf", "llama", no_alpha, _pair(q, 4, 64, 64))), 1, "x", 8
        ).scaling
        == 1.0
    )


def test_the_engine_refuses_an_unfit_gguf_adapter_and_serves_on(
    tmp_path: Path, default_model_dir: Path
) -> None:
    base = build_base("llama", tmp_path / "base", default_model_dir)
    llm = LLM(
        str(base), enable_lora=True, max_lora_rank=8, max_model_len=64, num_gpu_blocks_override=32
    )
    params = SamplingParams(max_tokens=4, temperature=0.0)
    want = llm.generate("Hello", params, use_tqdm=False)[0].outputs[0].token_ids
    adapter = make_adapter(base, tmp_path / "peft", 1, **ADAPTERS["attn-r8"])
    qwen = tmp_path / "qwen.gguf"
    write_gguf_lora(adapter, qwen, "qwen2", 4, 2)

    def refused(lora: LoRARequest, match: str) -> None:
        with pytest.raises(ValueError, match=match):
            llm.generate("Hello", params, use_tqdm=False, lora_request=lora)

    refused(LoRARequest("q", 1, str(qwen)), "general.architecture 'qwen2' does not match")
    wrong = _write(tmp_path / "s.gguf", "llama", LORA, _pair("blk.1.ffn_up.weight", 4, 64, 96))
    refused(LoRARequest("s", 2, str(wrong)), r"layers.1.up_proj.lora_B \(96, 4\): out_features 96")
    deep = _write(tmp_path / "d.gguf", "llama", LORA, _pair("blk.5.attn_q.weight", 4, 64, 64))
    refused(LoRARequest("d", 3, str(deep)), "the base model has 2 decoder layers")
    corrupt = tmp_path / "corrupt.gguf"
    corrupt.write_bytes(b"GGUF" + b"\x00" * 30)
    refused(LoRARequest("c", 4, str(corrupt)), str(corrupt))
    assert llm.generate("Hello", params, use_tqdm=False)[0].outputs[0].token_ids == want
    assert llm.kv_cache_stats()["num_loaded_loras"] == 0
