"""Speculative decoding: TPOT and output tokens/s with speculation off, ngram
and suffix, at 1, 4, 16 and 64 concurrent sequences, on input-grounded
prompts (answers that quote their input) and plain chat (``spec_prompts``).
With ``--methods ...,draft_self,draft_tiny``: method draft_model with the
target itself as the draft (every draft accepted: the machinery's cost) and
with a random-weights 2-layer Llama of the target's vocabulary and page shape
(drafts nearly always rejected: the draft model's overhead).

Each method has its own engine (the same model and settings); for every
workload and batch size the methods run one after the other, interleaved, on
the same prompts (greedy, the same outputs: checked and reported). Figures:
TPOT (mean over requests of (finish - first token) / (output tokens - 1)),
output tokens/s (all output tokens / wall time of the batch, prefill
included), acceptance rate (accepted / draft tokens) and mean accepted length
(1 + accepted / verify steps with drafts, vLLM's definition). The machine is
named beside the figures; on a shared machine compare ratios within a run.

    python benches/bench_spec_decode.py [--sizes 1,4,16,64] [--max-tokens 64] [--json]
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from common import chat_prompt_ids, json_safe, print_table
from pagedrs import LLM, SamplingParams
from pagedrs.executor.model_loader import load_config, resolve_model
from spec_prompts import WORKLOADS
from transformers import AutoConfig, AutoModelForCausalLM

SMOL_GGUF = Path.home() / ".cache" / "pagedrs" / "gguf" / "SmolLM2-135M-Instruct.Q4_1.gguf"
METHODS: dict[str, dict[str, Any] | None] = {
    "off": None,
    "ngram": {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 2,
              "prompt_lookup_max": 5},
    "suffix": {"method": "suffix", "num_speculative_tokens": 16},
}  # fmt: skip


def tiny_draft(model: str, folder: str) -> str:
    """A random-weights 2-layer LlamaForCausalLM of ``model``'s vocabulary and
    page shape (KV heads, head size), saved to ``folder``."""
    cfg = load_config(*resolve_model(model, None, None))
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    tiny = AutoConfig.for_model(
        "llama",
        vocab_size=cfg.vocab_size,
        hidden_size=kv_heads * head_dim,
        num_attention_heads=kv_heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        num_hidden_layers=2,
        intermediate_size=2 * kv_heads * head_dim,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(tiny).save_pretrained(folder)
    return folder


def draft_methods(model: str, k: int, folder: str) -> dict[str, dict[str, Any]]:
    """draft_self (the target as its own draft) and draft_tiny (``tiny_draft``), K = ``k``."""
    return {
        "draft_self": {"method": "draft_model", "model": model, "num_speculative_tokens": k},
        "draft_tiny": {
            "method": "draft_model",
            "model": tiny_draft(model, folder),
            "num_speculative_tokens": k,
        },
    }


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else the platform's."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _spec(llm: LLM) -> dict[str, Any]:
    s = llm.llm_engine.kv_cache_stats()
    return {k: v for k, v in s.items() if k.startswith("spec_decode")}


def run_batch(llm: LLM, prompts: list[list[int]], max_tokens: int) -> dict[str, Any]:
    """One batch of greedy requests: the figures and the outputs."""
    before = _spec(llm)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    t0 = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    wall = time.perf_counter() - t0
    after = _spec(llm)
    n_out = [len(o.outputs[0].token_ids) for o in outs]
    tpots = [
        (o.metrics.finished_time - o.metrics.first_token_time) / (n - 1)
        for o, n in zip(outs, n_out, strict=True)
        if o.metrics is not None
        and o.metrics.finished_time is not None
        and o.metrics.first_token_time is not None
        and n > 1
    ]
    drafts = after["spec_decode_num_drafts"] - before["spec_decode_num_drafts"]
    draft_tokens = after["spec_decode_num_draft_tokens"] - before["spec_decode_num_draft_tokens"]
    accepted = after["spec_decode_num_accepted_tokens"] - before["spec_decode_num_accepted_tokens"]
    return {
        "wall_s": wall,
        "output_tokens": sum(n_out),
        "output_tok_per_s": sum(n_out) / wall,
        "tpot_ms": 1000 * sum(tpots) / len(tpots) if tpots else float("nan"),
        "num_drafts": drafts,
        "num_draft_tokens": draft_tokens,
        "num_accepted_tokens": accepted,
        "acceptance_rate": accepted / draft_tokens if draft_tokens else float("nan"),
        "mean_accepted_length": 1 + accepted / drafts if drafts else float("nan"),
        "outputs": [list(o.outputs[0].token_ids) for o in outs],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(SMOL_GGUF), help="model (default: the GGUF Q4_1)")
    ap.add_argument("--sizes", default="1,4,16,64", help="concurrent sequences, comma-separated")
    ap.add_argument("--workloads", default="grounded,chat")
    ap.add_argument(
        "--methods", default="off,ngram,suffix", help="of off,ngram,suffix,draft_self,draft_tiny"
    )
    ap.add_argument("--draft-k", type=int, default=3, help="num_speculative_tokens of draft_*")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default torch's)")
    ap.add_argument("--json", action="store_true", help="print one JSON object last")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    sizes = [int(s) for s in args.sizes.split(",")]
    methods = args.methods.split(",")
    if any(m.startswith("draft_") for m in methods):
        METHODS.update(draft_methods(args.model, args.draft_k, tempfile.mkdtemp()))
    engines = {
        m: LLM(
            args.model,
            speculative_config=METHODS[m],
            max_model_len=args.max_model_len,
            kv_cache_memory_bytes=1 << 30,
            max_num_seqs=max(sizes),
        )
        for m in methods
    }
    tok = engines[methods[0]].get_tokenizer()
    results: list[dict[str, Any]] = []
    for workload in args.workloads.split(","):
        chats = WORKLOADS[workload](max(sizes))
        prompts = [chat_prompt_ids(tok, c)[: args.max_model_len - args.max_tokens] for c in chats]
        for size in sizes:
            outputs: dict[str, Any] = {}
            for m in methods:
                r = run_batch(engines[m], prompts[:size], args.max_tokens)
                outputs[m] = r.pop("outputs")
                r.update(workload=workload, sequences=size, method=m)
                r["identical_to_off"] = outputs[m] == outputs.get("off", outputs[m])
                results.append(r)
                print(json.dumps(json_safe(r)), flush=True)
    cpu = cpu_name()
    by_key = {(r["workload"], r["sequences"], r["method"]): r for r in results}
    rows = []
    for r in results:
        base = by_key.get((r["workload"], r["sequences"], "off"))
        speedup = base["tpot_ms"] / r["tpot_ms"] if base and r["tpot_ms"] else float("nan")
        rows.append(
            [
                r["workload"], r["sequences"], r["method"], r["tpot_ms"], speedup,
                r["output_tok_per_s"], r["acceptance_rate"], r["mean_accepted_length"],
                r["identical_to_off"],
            ]
        )  # fmt: skip
    print_table(
        f"speculative decoding, {Path(args.model).name}, {cpu}, "
        f"{torch.get_num_threads()} threads, greedy, max_tokens={args.max_tokens}",
        ["workload", "seqs", "method", "TPOT ms", "TPOT off/x", "out tok/s", "accept",
         "mean len", "identical"],
        rows,
    )  # fmt: skip
    if args.json:
        print(
            json.dumps(
                json_safe(
                    {
                        "benchmark": "spec_decode",
                        "cpu": cpu,
                        "threads": torch.get_num_threads(),
                        "model": Path(args.model).name,
                        "max_tokens": args.max_tokens,
                        "methods": {m: METHODS[m] for m in methods},
                        "results": results,
                    }
                )
            )
        )


if __name__ == "__main__":
    main()
