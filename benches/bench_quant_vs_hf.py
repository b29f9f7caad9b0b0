"""Quantized models in pagedrs against HF transformers on the same weights,
teacher-forced over ShareGPT-like replies.

Models (``--models``):

- ``smollm2``: the default SmolLM2-135M-Instruct Q4_1 GGUF;
- ``gemma3``: the real Gemma 3 270M Q4_K_M GGUF (Q4_K, Q5_0, Q6_K, Q8_0 tensors);
- ``int8``: the default float SmolLM2-135M-Instruct with ``quantization="int8"``
  (every decoder projection int8 per output channel).

pagedrs runs the whole engine (``LLM``, weights kept quantized, the Rust kernels,
paged attention) with ``prompt_logprobs=1``, once per ``activation_quantization``
(``--activations``: int16, int8). For the GGUF files llama.cpp runs the same
tokens on the same file (``llama-cpp-python``, its defaults: f16 KV cache, its
CPU repacking and Q8 activations; all logits) as a column of its own. The
reference is HF transformers in float32 with eager attention on the same weights
dequantized: for a GGUF,
``AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)`` (transformers
dequantizes the file); for ``int8``, the float checkpoint with each decoder
projection replaced by its dequantized int8 weight (``quantize_int8``, the same
rounding as the engine's). For ``int8`` the float checkpoint itself is also
compared (``vs_float``: what the int8 rounding costs, beside the engine's own
error).

Texts: the ``chosen`` replies of ../shared/data/dpo_en_demo.json with at least 64
tokens, the first ``--texts``, cut to ``--text-tokens`` tokens (the model's
tokenizer, BOS where it adds one). Per next-token position: ``mean_abs_dlogprob``
(mean |logprob pagedrs - logprob HF| of the actual next token), ``max``, and
``greedy_agreement`` (share of positions whose top-1 token is the same).

    python benches/bench_quant_vs_hf.py [--models smollm2 gemma3 int8]
        [--activations int16 int8] [--no-llama-cpp] [--texts 16] [--json]
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
from common import cpu_name, json_safe, print_table, read_data
from pagedrs import LLM, SamplingParams
from transformers import AutoModelForCausalLM, AutoTokenizer

CACHE = Path.home() / ".cache" / "pagedrs"
GGUF = {
    "smollm2": CACHE / "gguf" / "SmolLM2-135M-Instruct.Q4_1.gguf",
    "gemma3": CACHE / "gguf" / "gemma-3-270m-q4_k_m.gguf",
}
FLOAT_MODEL = CACHE / "models" / "smollm2-135m-instruct"
LABELS = {
    "smollm2": "SmolLM2-135M Q4_1 GGUF",
    "gemma3": "Gemma 3 270M Q4_K_M GGUF",
    "int8": 'SmolLM2-135M, quantization="int8"',
}


def texts(tokenizer: Any, n: int, length: int) -> list[list[int]]:
    """Token ids of the first ``n`` ShareGPT-like replies with >= 64 tokens, cut
    to ``length`` tokens."""
    out = []
    for r in read_data("dpo_en_demo.json"):
        ids = tokenizer(r["chosen"]["value"]).input_ids
        if len(ids) >= 64:
            out.append(list(ids[:length]))
        if len(out) == n:
            break
    return out


def pagedrs_logprobs(
    model: str, quantization: str | None, activations: str, ids: list[list[int]]
) -> tuple[list[list[float]], list[list[int]]]:
    """Per text: the logprob of each actual next token and the top-1 token at each
    position (positions 1..len-1), from pagedrs' prompt logprobs."""
    llm = LLM(
        model=model,
        quantization=quantization,
        activation_quantization=activations,
        max_model_len=max(map(len, ids)) + 8,
        kv_cache_memory_bytes=256 << 20,
        max_num_seqs=len(ids),
    )
    try:
        outs = llm.generate(
            [{"prompt_token_ids": t} for t in ids],
            SamplingParams(max_tokens=1, prompt_logprobs=1),
            use_tqdm=False,
        )
    finally:
        llm.llm_engine.shutdown()
    lps, tops = [], []
    for t, out in zip(ids, outs, strict=True):
        plp = out.prompt_logprobs or []
        lps.append([plp[i][t[i]].logprob for i in range(1, len(t))])  # type: ignore[index]
        tops.append(
            [next(k for k, v in plp[i].items() if v.rank == 1) for i in range(1, len(t))]  # type: ignore[union-attr]
        )
    return lps, tops


def hf_logprobs(
    model: torch.nn.Module, ids: list[list[int]]
) -> tuple[list[list[float]], list[list[int]]]:
    """The same figures from an HF model, one text at a time."""
    lps, tops = [], []
    with torch.no_grad():
        for t in ids:
            x = torch.tensor([t])
            logp = torch.log_softmax(model(x).logits[0, :-1].float(), -1)
            lps.append(logp.gather(1, x[0, 1:, None])[:, 0].tolist())
            tops.append(logp.argmax(-1).tolist())
    return lps, tops


def llama_cpp_logprobs(
    path: Path, ids: list[list[int]]
) -> tuple[list[list[float]], list[list[int]]]:
    """The same figures from llama.cpp on the GGUF file at ``path``, one text at
    a time (its logits of every position), on one thread."""
    import llama_cpp

    llm = llama_cpp.Llama(
        str(path),
        n_ctx=max(map(len, ids)) + 8,
        n_batch=512,
        n_threads=1,
        logits_all=True,
        verbose=False,
    )
    lps, tops = [], []
    for t in ids:
        llm.reset()
        llm.eval(t)
        logits = torch.from_numpy(llm.scores[: len(t) - 1].copy()).float()
        logp = torch.log_softmax(logits, -1)
        lps.append(logp.gather(1, torch.tensor(t[1:])[:, None])[:, 0].tolist())
        tops.append(logp.argmax(-1).tolist())
    llm.close()
    return lps, tops


def int8_reference(float_model: torch.nn.Module) -> torch.nn.Module:
    """``float_model`` with each decoder-layer ``nn.Linear`` weight replaced by its
    int8-per-channel dequantized values (what ``quantization="int8"`` keeps)."""
    from pagedrs.executor.quant.int8 import quantize_int8

    model = copy.deepcopy(float_model)
    for layer in model.model.layers:  # type: ignore[union-attr]
        for module in layer.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.data = quantize_int8(module.weight.data).dequantize()
    return model


def compare(a: tuple[list[list[float]], list[list[int]]], b: Any) -> dict[str, float]:
    """mean / max |dlogprob| and top-1 agreement of ``a`` against ``b``."""
    pairs = list(zip(a[0], b[0], strict=True))
    diffs = [abs(x - y) for xs, ys in pairs for x, y in zip(xs, ys, strict=True)]
    tops = list(zip(a[1], b[1], strict=True))
    agree = [x == y for xs, ys in tops for x, y in zip(xs, ys, strict=True)]
    return {
        "positions": len(diffs),
        "mean_abs_dlogprob": sum(diffs) / len(diffs),
        "max_abs_dlogprob": max(diffs),
        "greedy_agreement": sum(agree) / len(agree),
    }


def measure(key: str, args: argparse.Namespace) -> dict[str, Any]:
    """The figures of one model (``--models`` key): per activation scheme (and
    llama.cpp for a GGUF) the comparison with HF on the same weights."""
    t0 = time.perf_counter()
    res: dict[str, Any] = {}
    if key == "int8":
        tok = AutoTokenizer.from_pretrained(FLOAT_MODEL)
        ids = texts(tok, args.texts, args.text_tokens)
        float_model = AutoModelForCausalLM.from_pretrained(
            FLOAT_MODEL, dtype=torch.float32, attn_implementation="eager"
        ).eval()
        ref = hf_logprobs(int8_reference(float_model), ids)
        ref_float = hf_logprobs(float_model, ids)
        for a in args.activations:
            ours = pagedrs_logprobs(str(FLOAT_MODEL), "int8", a, ids)
            res[a] = compare(ours, ref)
            res[a]["vs_float"] = compare(ours, ref_float)
    else:
        path = GGUF[key]
        tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        ids = texts(tok, args.texts, args.text_tokens)
        model = AutoModelForCausalLM.from_pretrained(
            path.parent, gguf_file=path.name, dtype=torch.float32, attn_implementation="eager"
        ).eval()
        ref = hf_logprobs(model, ids)
        del model
        for a in args.activations:
            res[a] = compare(pagedrs_logprobs(str(path), None, a, ids), ref)
        if args.llama_cpp:
            res["llama.cpp"] = compare(llama_cpp_logprobs(path, ids), ref)
    res["texts"] = len(ids)
    res["seconds"] = time.perf_counter() - t0
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=list(LABELS), choices=list(LABELS))
    ap.add_argument("--activations", nargs="+", default=["int16", "int8"])
    ap.add_argument(
        "--no-llama-cpp", dest="llama_cpp", action="store_false", help="no llama.cpp column"
    )
    ap.add_argument("--texts", type=int, default=16)
    ap.add_argument("--text-tokens", type=int, default=256)
    ap.add_argument("--json", action="store_true", help="print one JSON object last")
    args = ap.parse_args()
    if args.llama_cpp:
        from llama_cpp_peer import available

        args.llama_cpp = available()
    torch.set_grad_enabled(False)
    figures = {}
    for key in args.models:
        figures[key] = measure(key, args)
        print(f"{key}: {json.dumps(json_safe(figures[key]))}", file=sys.stderr, flush=True)
    rows = []
    for key, f in figures.items():
        for engine in [*args.activations, "llama.cpp"]:
            if engine not in f:
                continue
            label = engine if engine == "llama.cpp" else f"pagedrs, {engine} activations"
            for ref, v in [("HF, same weights dequantized", f[engine])] + (
                [("HF, the float checkpoint", f[engine]["vs_float"])]
                if "vs_float" in f[engine]
                else []
            ):
                rows.append(
                    [
                        LABELS[key],
                        label,
                        ref,
                        v["positions"],
                        f"{v['mean_abs_dlogprob']:.4f}",
                        f"{v['max_abs_dlogprob']:.4f}",
                        f"{v['greedy_agreement']:.4f}",
                    ]
                )
    print_table(
        f"pagedrs quantized vs HF transformers (float32, eager), teacher-forced over "
        f"{args.texts} ShareGPT-like replies of <= {args.text_tokens} tokens",
        [
            "model",
            "engine",
            "reference",
            "positions",
            "mean |dlogp|",
            "max |dlogp|",
            "top-1 agree",
        ],
        rows,
    )
    if args.json:
        out = {"texts": args.texts, "cpu": cpu_name(), "models": figures}
        print(json.dumps(json_safe(out)))


if __name__ == "__main__":
    main()
