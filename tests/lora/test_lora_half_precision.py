"""LoRA adapters on bfloat16 and float16 models: the adapted projection equals
PEFT's ``lora.Linear`` on the same half-precision base layer (adapter in
float32, PEFT's default), and a mixed batch of adapters and the base model
gives each request HF + PEFT's greedy tokens and logprobs in the same dtype,
on a tiny Llama and on SmolLM2."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from lora_models import ADAPTERS, build_base, check_output, make_adapter, peft, peft_references
from pagedrs import LLM, LoRARequest, SamplingParams
from pagedrs.lora.adapter import LoRAWeights
from pagedrs.lora.layers import LoRAModule, LoRAStep, SlotStack
from torch import nn

HALF = {"bfloat16": torch.bfloat16, "float16": torch.float16}
MANTISSA = {torch.bfloat16: 7, torch.float16: 10}
SMALLEST = {torch.bfloat16: 2.0**-133, torch.float16: 2.0**-24}  # the subnormal step

#: pagedrs' product and PEFT's (torch's float32 matmuls) sum in different
#: orders; the largest float32 difference measured, beyond one rounding of the
#: output, was 9.4e-6 x |product| (float16, 576 -> 1536, rank 16, Xeon with
#: AMX); 1e-4 leaves ~10x for other CPUs.
PRODUCT_RTOL = 1e-4

#: End to end, a half-precision model's logits are not HF's bits: the base
#: projections and attention round to bfloat16 / float16 in other orders
#: (oneDNN's packed GEMM, the paged kernels) than HF's eager modules, so the
#: base model alone differs as much as the adapters do. Largest |dlogprob|
#: measured (Xeon with AMX, 2 prompts, adapters and base in one batch), adapter
#: requests / base requests: bfloat16 tiny Llama 0.064 / 0.093, SmolLM2 0.169 /
#: 0.155; float16 tiny Llama 0.0078 / 0.0077, SmolLM2 0.057 / 0.011. TOL leaves
#: ~3x. Greedy tokens parted from HF's only where HF's bfloat16 top-2 logits
#: were an exact tie (gap 0.0, twice); TIE leaves room for a few spacings of a
#: logit of 8-32 (bfloat16 0.0625-0.125, float16 0.008-0.016).
TOL = {torch.bfloat16: 0.5, torch.float16: 0.2}
TIE = {torch.bfloat16: 0.25, torch.float16: 0.05}

MAX_TOKENS = 16
PROMPTS = ["The capital of France is", "Name three rivers."]


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _ulp(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The spacing of ``dtype`` at each of ``values`` (float32)."""
    exponent = torch.floor(torch.log2(values.abs().clamp_min(1e-38)))
    return torch.exp2(exponent - MANTISSA[dtype]).clamp_min(SMALLEST[dtype])


@pytest.mark.parametrize("dtype", list(HALF.values()), ids=list(HALF))
@pytest.mark.parametrize(("k", "n", "rank"), [(64, 96, 8), (576, 1536, 16), (1536, 576, 4)])
def test_adapted_projection_equals_peft(dtype: torch.dtype, k: int, n: int, rank: int) -> None:
    """Rows with an adapter: PEFT's ``(base(x) + B(A x) * scaling).to(dtype)``
    within one rounding of ``dtype`` (plus the float32 sums' order); rows
    without one: the base layer's bits."""
    torch.manual_seed(k + n)
    base = nn.Linear(k, n, bias=False).to(dtype)
    holder = nn.Module()
    holder.proj = base
    config = peft.LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=["proj"])
    model = peft.get_peft_model(holder, config)  # type: ignore[arg-type]
    lin = model.base_model.model.proj
    lora_a, lora_b = lin.lora_A["default"].weight, lin.lora_B["default"].weight
    assert lora_a.dtype == torch.float32  # PEFT's default autocast_adapter_dtype
    with torch.no_grad():
        lora_b.normal_(std=rank**-0.5)
    stack = SlotStack(3, 16, k, n)
    stack.set(1, LoRAWeights(lora_a.detach(), lora_b.detach()), lin.scaling["default"])
    step = LoRAStep()
    mine = LoRAModule(base, stack, step)
    x = torch.randn(40, k).to(dtype)
    step.slots = np.ones(40, dtype=np.int32)
    step.slots[::3] = -1
    with torch.no_grad():
        got, want, plain = mine(x), lin(x), base(x)
        product = lin.lora_B["default"](lin.lora_A["default"](x.float())) * lin.scaling["default"]
    assert got.dtype == dtype
    rows = torch.from_numpy(step.slots >= 0)
    assert torch.equal(got[~rows], plain[~rows])
    g, w = got[rows].float(), want[rows].float()
    bound = _ulp(torch.maximum(g.abs(), w.abs()), dtype) + PRODUCT_RTOL * product[rows].abs()
    assert bool(((g - w).abs() <= bound).all())
    assert float((g == w).float().mean()) > 0.99  # measured >= 0.997: mostly the same bits


def _half_llm(model_dir: Path, dtype: str, rank: int) -> LLM:
    return LLM(
        str(model_dir),
        dtype=dtype,
        enable_lora=True,
        max_loras=2,
        max_lora_rank=rank,
        max_model_len=128,
        num_gpu_blocks_override=64,
    )


def _mixed_batch_equals_peft(
    llm: LLM, base: Path, folders: list[Path], dtype: torch.dtype, max_tokens: int
) -> None:
    loras: list[LoRARequest | None] = [
        LoRARequest(f.name, i + 1, str(f)) for i, f in enumerate(folders)
    ]
    loras.append(None)
    prompts = [p for p in PROMPTS for _ in loras]
    per_prompt = [lora for _ in PROMPTS for lora in loras]
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, logprobs=0)
    outs = llm.generate(prompts, params, use_tqdm=False, lora_request=per_prompt)
    worst = 0.0
    for lora in loras:
        folder = None if lora is None else Path(lora.lora_path)
        refs = peft_references(base, folder, PROMPTS, max_tokens, merged=False, dtype=dtype)
        got = [o for o, lo in zip(outs, per_prompt, strict=True) if lo is lora]
        for prompt, out in zip(PROMPTS, got, strict=True):
            here = check_output(out, refs[prompt], TOL[dtype], TIE[dtype])
            worst = max(worst, here)
            if os.environ.get("LORA_HALF_REPORT"):
                same = out.outputs[0].token_ids == refs[prompt].tokens
                print(f"\n{base.name} {dtype} {folder and folder.name}: {here:.3e} same={same}")
    # Each adapter changes the outputs: a request got its own adapter.
    firsts = {tuple(outs[j].outputs[0].token_ids) for j in range(len(loras))}
    assert len(firsts) == len(loras)


@pytest.mark.parametrize("dtype", list(HALF))
def test_tiny_llama_mixed_batch_equals_peft(
    dtype: str, tmp_path: Path, default_model_dir: Path
) -> None:
    base = build_base("llama", tmp_path / "llama", default_model_dir)
    folders = [
        make_adapter(base, tmp_path / name, i + 1, **ADAPTERS[name])
        for i, name in enumerate(("attn-r8", "all-r16"))
    ]
    llm = _half_llm(base, dtype, 16)
    _mixed_batch_equals_peft(llm, base, folders, HALF[dtype], MAX_TOKENS)


@pytest.mark.parametrize("dtype", list(HALF))
def test_smollm2_mixed_batch_equals_peft(
    dtype: str, tmp_path: Path, default_model_dir: Path
) -> None:
    targets = [["q_proj", "v_proj", "down_proj"], ["k_proj", "o_proj", "gate_proj", "up_proj"]]
    folders = [
        make_adapter(
            default_model_dir, tmp_path / f"smol{i}", 7 + i, r=8, lora_alpha=16, target_modules=t
        )
        for i, t in enumerate(targets)
    ]
    llm = _half_llm(default_model_dir, dtype, 8)
    _mixed_batch_equals_peft(llm, default_model_dir, folders, HALF[dtype], 8)
