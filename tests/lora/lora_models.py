"""Tiny base models and PEFT adapters of the LoRA tests, and the PEFT
reference (transformers + peft, adapter unmerged, and the merged weights)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

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

#: A chosen token's logprob may differ from HF's by this much; greedy tokens may
#: differ once HF's top-2 logits are within TIE of each other. pagedrs' batched
#: steps (LoRA kernel) against PEFT's model run alone are not equal bits: the
#: largest |dlogprob| measured was 5.9e-6 (the SmolLM2 adapter, Xeon with AMX,
#: 2 cores); 1e-4 leaves ~17x for other CPUs' float32 rounding.
LOGPROB_TOL = 1e-4
TIE = 1e-4

peft = pytest.importorskip("peft")  # the reference (the `test` extra installs it)

#: case -> (model_type, config kwargs): pagedrs' own code (llama, qwen2)
#: and HF's modules with sliding-window layers (gemma3_text).
BASES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("llama", _COMMON),
    "qwen2": ("qwen2", _COMMON),
    "gemma3_text": (
        "gemma3_text",
        {
            **_COMMON,
            "head_dim": 16,
            "sliding_window": 44,
            "query_pre_attn_scalar": 16,
            "final_logit_softcapping": 30.0,
        },
    ),
}

#: adapter -> LoraConfig fields: two ranks, different target sets, rsLoRA.
ADAPTERS: dict[str, dict[str, Any]] = {
    "attn-r8": {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]},
    "all-r16": {
        "r": 16,
        "lora_alpha": 8,
        "target_modules": [
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
            "gate_proj",
            "up_proj",
            "down_proj",
        ],
    },
    "mlp-r4-rslora": {
        "r": 4,
        "lora_alpha": 4,
        "use_rslora": True,
        "target_modules": ["gate_proj", "down_proj", "o_proj"],
    },
}


def build_base(case: str, folder: Path, tokenizer_dir: Path, **overrides: Any) -> Path:
    """A tiny random model of ``case`` (config fields ``overrides`` changed)
    saved with the default tokenizer."""
    model_type, kwargs = BASES[case]
    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, **{**kwargs, **overrides})
    config.initializer_range = 0.2  # peaked logits: greedy ties are rare
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(folder)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(folder)
    return folder


def make_adapter(base_dir: Path, folder: Path, seed: int, **fields: Any) -> Path:
    """A PEFT LoRA adapter of ``base_dir`` with random A and non-zero B
    (``std`` of B ~ 1/sqrt(r) so the adapter changes the outputs)."""
    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    model = peft.get_peft_model(base, peft.LoraConfig(init_lora_weights=False, **fields))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=1.0 / math.sqrt(fields["r"]))
    model.save_pretrained(folder)
    return folder


@dataclass
class Reference:
    """Greedy tokens and each step's float32 logits."""

    tokens: list[int]
    logits: list[torch.Tensor]


def _generate(model: Any, ids: torch.Tensor, max_tokens: int) -> Reference:
    out = model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_tokens,
        do_sample=False,
        pad_token_id=0,
        output_logits=True,
        return_dict_in_generate=True,
    )
    return Reference(
        out.sequences[0, ids.shape[1] :].tolist(), [lg[0].float() for lg in out.logits]
    )


def peft_references(
    base_dir: Path,
    adapter_dir: Path | None,
    prompts: list[str],
    max_tokens: int,
    merged: bool,
    dtype: torch.dtype = torch.float32,
) -> dict[str, Reference]:
    """HF's greedy outputs with the adapter unmerged (PEFT), merged into the
    weights (``merge_and_unload``), or without one (``adapter_dir`` None);
    eager attention, the model in ``dtype`` (PEFT keeps the adapter's
    matrices in float32: its default ``autocast_adapter_dtype=True``)."""
    tok = AutoTokenizer.from_pretrained(base_dir)
    model: Any = AutoModelForCausalLM.from_pretrained(
        base_dir, dtype=dtype, attn_implementation="eager"
    )
    if adapter_dir is not None:
        model = peft.PeftModel.from_pretrained(model, adapter_dir)
        if merged:
            model = model.merge_and_unload()
    model.eval()
    with torch.no_grad():
        return {
            p: _generate(model, tok(p, return_tensors="pt").input_ids, max_tokens) for p in prompts
        }


def check_output(out: Any, ref: Reference, tol: float = LOGPROB_TOL, tie: float = TIE) -> float:
    """Tokens of a pagedrs ``RequestOutput`` equal ``ref``'s until HF's top-2
    logits tie within ``tie``; each chosen token's logprob within ``tol`` of
    HF's. Returns the largest |dlogprob| seen."""
    got = out.outputs[0]
    worst = 0.0
    for i, (token, logits) in enumerate(zip(ref.tokens, ref.logits, strict=True)):
        top2 = torch.topk(logits, 2).values
        if got.token_ids[i] != token:
            assert float(top2[0] - top2[1]) < tie, f"step {i}: {got.token_ids} vs {ref.tokens}"
            return worst
        want = float(torch.log_softmax(logits, -1)[token])
        assert got.logprobs[i][token].logprob == pytest.approx(want, abs=tol), f"step {i}"
        worst = max(worst, abs(got.logprobs[i][token].logprob - want))
    assert got.token_ids == ref.tokens
    return worst
