"""pagedrs against llama.cpp on the same GGUF file, per architecture:
teacher-forced next-token agreement and mean |Δ logprob|.

For each architecture of ``gguf_archs.GGUF_ARCHS`` a random-weight file at a
small shape (``SHAPE``: hidden 1024, FFN 2816, 8 layers, 16 query / 4 KV heads of
64, the SmolLM2 vocabulary of 49,152 tokens; MoE: 8 experts of FFN 512, 2 per
token) is written with ``tests/models/gguf_writer.py`` (llama.cpp's converter
layout, the SmolLM2 GGUF's tokenizer fields) and cached under
``~/.cache/pagedrs/gguf/archs``; the cached trained files (SmolLM2-135M Q4_1:
``llama``, Gemma 3 270M Q4_K_M: ``gemma3``) are measured too. Both engines read
the same token ids (llama.cpp tokenizes ``TEXT``): llama.cpp (llama-cpp-python,
``logits_all``, in its own process) and pagedrs (``prompt_logprobs=1``) give, at
each position, the most likely next token and the logprob of the actual next
token. Reported per file: the fraction of positions whose most likely token
agrees, and the mean and max |logprob pagedrs - logprob llama.cpp| of the
actual tokens; and each engine's mean |Δ logprob| against the float32
reference on the file's dequantized weights (HF's modules, eager attention:
``reference_side``), which tells whose rounding a gap is; and that
reference with each projection's input rounded to int8 per 32 values (as
llama.cpp rounds activations) against the reference: how sensitive the model
is to that rounding (random-weight mixtures of experts and Phi-3 are far more
sensitive than the others: an expert chosen differently at one position
changes every later one).

Random weights give flatter next-token distributions than trained ones (more
near-ties), so agreement on them is a lower bound of what trained files show.

``--shape 1b`` writes the random files at a Llama-3.2-1B-class body instead
(``SHAPE_1B``).

    python benches/bench_gguf_archs.py [--archs llama,qwen2,...] [--shape small|1b] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path.home() / ".cache" / "pagedrs" / "gguf"
SMOL = CACHE / "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA = CACHE / "gemma-3-270m-q4_k_m.gguf"
FLOAT_TOKENIZER = Path.home() / ".cache" / "pagedrs" / "models" / "smollm2-135m-instruct"

TEXT = (
    "Paged attention stores the keys and values of each sequence in fixed-size "
    "blocks that need not be contiguous in memory, so the cache of a running "
    "request grows one block at a time and the blocks of finished requests return "
    "to a shared pool at once. Sequences that share a prompt can share its blocks. "
    "The scheduler admits waiting requests while free blocks remain, and when the "
    "pool runs dry it preempts the most recently admitted group, whose blocks are "
    "either swapped to host memory or dropped and recomputed later."
)

SHAPE: dict[str, Any] = {
    "vocab_size": 49152,
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "num_hidden_layers": 8,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "max_position_embeddings": 4096,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
    "initializer_range": 0.05,
}
#: ``--shape 1b``: a Llama-3.2-1B-class body (hidden 2048, FFN 8192, 16 layers,
#: 32 query / 8 KV heads of 64) over the same vocabulary, laid over each case's
#: config (mixtures of experts keep their experts' FFN of 512).
SHAPE_1B: dict[str, Any] = {
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
}
_MOE = {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 512}
_GEMMA = {"head_dim": 64, "sliding_window": 64, "query_pre_attn_scalar": 64}

#: case -> (GGUF architecture, HF model type, config kwargs, main type, wide type).
CASES: dict[str, tuple[str, str, dict[str, Any], str, str]] = {
    "llama": ("llama", "llama", SHAPE, "Q4_0", "Q8_0"),
    "qwen2": ("qwen2", "qwen2", SHAPE, "Q8_0", "Q4_0"),
    "qwen3": ("qwen3", "qwen3", {**SHAPE, "head_dim": 64}, "Q4_K", "Q6_K"),
    "qwen2moe": (
        "qwen2moe",
        "qwen2_moe",
        {**SHAPE, **_MOE, "shared_expert_intermediate_size": 1024},
        "Q4_K",
        "Q8_0",
    ),
    "qwen3moe": (
        "qwen3moe",
        "qwen3_moe",
        {**SHAPE, **_MOE, "head_dim": 64, "norm_topk_prob": True},
        "Q4_0",
        "Q6_K",
    ),
    "phi3": ("phi3", "phi3", {**SHAPE, "pad_token_id": 0}, "Q4_K", "Q6_K"),
    "gemma2": (
        "gemma2",
        "gemma2",
        {**SHAPE, **_GEMMA, "tie_word_embeddings": True},
        "Q8_0",
        "Q6_K",
    ),
    "gemma3": ("gemma3", "gemma3_text", {**SHAPE, **_GEMMA}, "Q4_K", "Q8_0"),
    "olmo2": ("olmo2", "olmo2", SHAPE, "Q4_0", "Q6_K"),
    "granite": (
        "granite",
        "granite",
        {
            **SHAPE,
            "logits_scaling": 4.0,
            "embedding_multiplier": 2.0,
            "residual_multiplier": 0.5,
            "attention_multiplier": 1.0 / 64,
        },
        "Q4_K",
        "Q4_0",
    ),
    "starcoder2": ("starcoder2", "starcoder2", SHAPE, "Q8_0", "Q4_K"),
}


#: Files for speed (``bench_quantized.py --models qwen3moe``): a slice of
#: Qwen3-30B-A3B's shape (hidden 2048, 32 query / 4 KV heads of 128, experts of
#: FFN 768, 8 routed per token) with 32 experts instead of 128 and 4 layers
#: instead of 48, in Q4_K with Q6_K ``attn_v`` / ``ffn_down_exps`` / embeddings
#: (as Q4_K_M), the SmolLM2 vocabulary.
SPEED_CASES: dict[str, tuple[str, str, dict[str, Any], str, str]] = {
    "qwen3moe-slice": (
        "qwen3moe",
        "qwen3_moe",
        {
            **SHAPE,
            "hidden_size": 2048,
            "intermediate_size": 6144,
            "num_hidden_layers": 4,
            "num_attention_heads": 32,
            "num_key_value_heads": 4,
            "head_dim": 128,
            "num_experts": 32,
            "num_experts_per_tok": 8,
            "moe_intermediate_size": 768,
            "norm_topk_prob": True,
        },
        "Q4_K",
        "Q6_K",
    ),
}


def write_case(case: str, shape: str = "small") -> Path:
    """The cached random-weight file of ``case`` (``CASES``, ``SPEED_CASES``)
    at ``shape`` (``small``: ``SHAPE``; ``1b``: ``SHAPE_1B`` over it; the speed
    cases have their own), written once."""
    arch, model_type, kwargs, qtype, second = {**CASES, **SPEED_CASES}[case]
    if case in SPEED_CASES:
        shape = ""
    else:
        kwargs = {**kwargs, **SHAPE_1B} if shape == "1b" else kwargs
        shape = f"-{shape}"
    path = CACHE / "archs" / f"{case}{shape}-random.{qtype}.gguf"
    if path.exists():
        return path
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    sys.path.insert(0, str(ROOT / "tests" / "models"))
    from gguf_writer import write_gguf

    path.parent.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, **kwargs)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tmp = path.with_suffix(".tmp")
    write_gguf(tmp, arch, model, qtype, second, tokenizer_from=SMOL)
    tmp.rename(path)
    return path


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def llama_cpp_side(path: str, text: str) -> tuple[list[int], list[int], list[float]]:
    """(token ids of ``text``, most likely next token at each position but the
    last, logprob of each actual next token) from llama.cpp, one thread."""
    import llama_cpp

    llm = llama_cpp.Llama(
        model_path=path, n_ctx=512, n_batch=512, logits_all=True, n_threads=1, verbose=False
    )
    ids = llm.tokenize(text.encode(), add_bos=True)
    llm.eval(ids)
    logp = _log_softmax(np.asarray(llm.scores[: len(ids)]))
    top = logp[:-1].argmax(axis=-1).tolist()
    actual = [float(logp[i, ids[i + 1]]) for i in range(len(ids) - 1)]
    return ids, top, actual


def pagedrs_side(
    path: Path, ids: list[int], tokenizer: str | None
) -> tuple[list[int], list[float]]:
    """pagedrs' most likely next token and the actual token's logprob at each
    position (``prompt_logprobs=1``), float32."""
    import torch
    from pagedrs import LLM, SamplingParams

    torch.set_num_threads(1)
    llm = LLM(
        model=str(path), tokenizer=tokenizer, max_model_len=512, kv_cache_memory_bytes=1 << 27
    )
    out = llm.generate(
        [{"prompt_token_ids": ids}], SamplingParams(max_tokens=1, prompt_logprobs=1), use_tqdm=False
    )[0]
    llm.llm_engine.shutdown()
    plp = out.prompt_logprobs
    assert plp is not None
    top, actual = [], []
    for i in range(1, len(ids)):
        entry = plp[i]
        assert entry is not None
        top.append(next(t for t, lp in entry.items() if lp.rank == 1))
        actual.append(entry[ids[i]].logprob)
    return top, actual


def _int8_per_32(x: Any) -> Any:
    """``x`` rounded as llama.cpp's Q8_0 activations: per 32 values, int8
    steps of amax / 127."""
    import torch

    v = x.float().reshape(-1, 32)
    d = v.abs().amax(-1, keepdim=True) / 127
    q = torch.where(d > 0, torch.round(v / d), torch.zeros_like(v)) * d
    return q.reshape(x.shape).to(x.dtype)


def reference_side(path: Path, ids: list[int], int8_activations: bool = False) -> list[float]:
    """The actual tokens' logprobs of the float32 reference: HF's modules with
    eager attention, every quantized projection as its dequantized weight
    through ``F.linear`` (``QuantizedLinear.reference``); with
    ``int8_activations`` each projection's input first rounded to int8 per 32
    values (``_int8_per_32``, what llama.cpp does to activations before its
    integer dot products): the model's sensitivity to that rounding."""
    import torch
    from pagedrs.executor.quant.gguf_archs import read_config
    from pagedrs.executor.quant.gguf_loader import load_gguf_quantized
    from pagedrs.executor.quant.linear import QuantizedLinear

    model = load_gguf_quantized(path, read_config(path), torch.float32)
    model.set_attn_implementation("eager")
    call = QuantizedLinear.__call__
    reference = QuantizedLinear.reference

    def forward(self: QuantizedLinear, x: torch.Tensor) -> torch.Tensor:
        return reference(self, _int8_per_32(x) if int8_activations else x)

    QuantizedLinear.__call__ = forward  # type: ignore[method-assign]
    try:
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].numpy()
    finally:
        QuantizedLinear.__call__ = call  # type: ignore[method-assign]
    logp = _log_softmax(logits)
    return [float(logp[i, ids[i + 1]]) for i in range(len(ids) - 1)]


def measure(name: str, path: Path, tokenizer: str | None) -> dict[str, Any]:
    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
        ids, top_ll, lp_ll = pool.submit(llama_cpp_side, str(path), TEXT).result()
    top_pc, lp_pc = pagedrs_side(path, ids, tokenizer)
    lp_ref = np.asarray(reference_side(path, ids))
    lp_int8 = np.asarray(reference_side(path, ids, int8_activations=True))
    diff = np.abs(np.asarray(lp_pc) - np.asarray(lp_ll))
    agree = float(np.mean(np.asarray(top_pc) == np.asarray(top_ll)))
    return {
        "file": path.name,
        "positions": len(ids) - 1,
        "agreement": agree,
        "mean_abs_dlogprob": float(diff.mean()),
        "max_abs_dlogprob": float(diff.max()),
        "pagedrs_vs_reference": float(np.abs(np.asarray(lp_pc) - lp_ref).mean()),
        "llama_cpp_vs_reference": float(np.abs(np.asarray(lp_ll) - lp_ref).mean()),
        "reference_int8_activations_vs_reference": float(np.abs(lp_int8 - lp_ref).mean()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archs", default=",".join(CASES), help="comma-separated cases")
    parser.add_argument(
        "--shape", choices=["small", "1b"], default="small", help="random files' shape"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    args = parser.parse_args()
    rows: dict[str, dict[str, Any]] = {}
    tokenizer = str(FLOAT_TOKENIZER) if FLOAT_TOKENIZER.exists() else str(SMOL)
    for case in args.archs.split(","):
        rows[case] = {
            "arch": CASES[case][0],
            "weights": "random",
            **measure(case, write_case(case, args.shape), tokenizer),
        }
        print(case, rows[case], flush=True)
    trained = [("llama (SmolLM2-135M)", "llama", SMOL), ("gemma3 (Gemma 3 270M)", "gemma3", GEMMA)]
    for name, arch, path in trained:
        if path.exists() and arch in args.archs.split(","):
            rows[name] = {"arch": arch, "weights": "trained", **measure(name, path, None)}
            print(name, rows[name], flush=True)
    print()
    print(
        "| file | arch | weights | positions | next-token agreement | mean abs dlogprob | max "
        "| pagedrs vs reference | llama.cpp vs reference | int8 activations vs reference |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        print(
            f"| {name} | {r['arch']} | {r['weights']} | {r['positions']} | "
            f"{r['agreement']:.3f} | {r['mean_abs_dlogprob']:.4f} | {r['max_abs_dlogprob']:.4f} | "
            f"{r['pagedrs_vs_reference']:.4f} | {r['llama_cpp_vs_reference']:.4f} | "
            f"{r['reference_int8_activations_vs_reference']:.4f} |"
        )
    if args.json:
        from pagedrs.plan.cpu_info import cpu_name

        info = {}
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("cpu family", "model") and key.strip() not in info:
                info[key.strip()] = value.strip()
        cpu = f"{cpu_name()} (family {info.get('cpu family')} model {info.get('model')})"
        out = {"cpu": cpu, "threads": 1, "shape": args.shape, "text": TEXT, "rows": rows}
        print(json.dumps(out))


if __name__ == "__main__":
    main()
