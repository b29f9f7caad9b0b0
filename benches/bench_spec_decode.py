"""Speculative decoding: TPOT and output tokens/s with speculation off, ngram
and suffix, at 1, 4, 16, 64 and 256 concurrent sequences, on input-grounded
prompts (answers that quote their input) and plain chat (``spec_prompts``).
With ``--methods ...,draft_self,draft_tiny``: method draft_model with the
target itself as the draft (every draft accepted: the machinery's cost) and
with a random-weights 2-layer Llama of the target's vocabulary and page shape
(drafts nearly always rejected: the draft model's overhead).

Each method has its own engine (the same model and settings); for every
workload and batch size the methods run one after the other, interleaved, on
the same prompts (greedy, the same outputs: checked and reported). ``ngram``
and ``suffix`` draft under the goodput draft-length policy (the default),
both on the step costs the first of them measured at start-up (reported);
``ngram_fixed`` / ``suffix_fixed`` draft every proposal in full. Figures:
TPOT (mean over requests of (finish - first token) / (output tokens - 1)),
output tokens/s (all output tokens / wall time of the batch, prefill
included) and both as ratios to speculation off in the same run, the ratio of
output tokens per CPU second of the process (less sensitive to other processes'
load than wall time), acceptance
rate (accepted / draft tokens) and mean accepted length (1 + accepted /
verify steps with drafts, vLLM's definition). The machine is named beside the
figures; on a shared machine compare ratios within a run: with ``--repeats R``
each batch size runs R interleaved rounds (the methods' order rotated), the
table shows each method's round of median tokens/s and the medians of its
per-round ratios to off. Suffix decoding's global tree keeps the outputs of
earlier batches, the same prompts in later rounds: its later rounds accept
more than a first sight of the prompts would.

    python benches/bench_spec_decode.py [--sizes 1,4,16,64,256] [--max-tokens 64]
        [--max-prompt-tokens N] [--repeats R] [--chat-template FILE] [--json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
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
    "ngram_fixed": {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 2,
                    "prompt_lookup_max": 5, "draft_length_policy": "fixed"},
    "suffix_fixed": {"method": "suffix", "num_speculative_tokens": 16,
                     "draft_length_policy": "fixed"},
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
    t0, c0 = time.perf_counter(), time.process_time()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
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
        "cpu_s": cpu,
        "output_tok_per_cpu_s": sum(n_out) / cpu,
        "tpot_ms": 1000 * sum(tpots) / len(tpots) if tpots else float("nan"),
        "num_drafts": drafts,
        "num_draft_tokens": draft_tokens,
        "num_accepted_tokens": accepted,
        "acceptance_rate": accepted / draft_tokens if draft_tokens else float("nan"),
        "mean_accepted_length": 1 + accepted / drafts if drafts else float("nan"),
        "outputs": [list(o.outputs[0].token_ids) for o in outs],
    }


def measure_size(
    engines: dict[str, LLM],
    methods: list[str],
    prompts: list[list[int]],
    max_tokens: int,
    repeats: int,
    **key: Any,
) -> list[dict[str, Any]]:
    """``repeats`` rounds of one batch per method (the order rotated each
    round); per method, the round of median output tokens/s, with the
    medians over rounds of its ratios to speculation off in the same round
    (``tok_per_s_x_over_off``, ``tpot_off_over_x``) and every round's
    tokens/s (``tok_per_s_rounds``)."""
    rounds: list[dict[str, dict[str, Any]]] = []
    outputs: dict[str, list[Any]] = {m: [] for m in methods}
    for rep in range(repeats):
        shift = rep % len(methods)
        by_method: dict[str, dict[str, Any]] = {}
        for m in methods[shift:] + methods[:shift]:
            r = run_batch(engines[m], prompts, max_tokens)
            outputs[m].append(r.pop("outputs"))
            r.update(key, method=m, round=rep)
            by_method[m] = r
            print(json.dumps(json_safe(r)), flush=True)
        rounds.append(by_method)
    reference = outputs.get("off", [])
    results = []
    for m in methods:
        runs = [rd[m] for rd in rounds]
        ratios, tpot_ratios, cpu_ratios = [], [], []
        for rd in rounds:
            if "off" in rd:
                ratios.append(rd[m]["output_tok_per_s"] / rd["off"]["output_tok_per_s"])
                cpu_ratios.append(rd[m]["output_tok_per_cpu_s"] / rd["off"]["output_tok_per_cpu_s"])
                if rd[m]["tpot_ms"]:
                    tpot_ratios.append(rd["off"]["tpot_ms"] / rd[m]["tpot_ms"])
        best = sorted(runs, key=lambda r: r["output_tok_per_s"])[(len(runs) - 1) // 2]
        results.append(
            {
                **best,
                "identical_to_off": all(o == ref for o in outputs[m] for ref in reference),
                "tok_per_s_rounds": [r["output_tok_per_s"] for r in runs],
                "tok_per_s_x_over_off": statistics.median(ratios) if ratios else float("nan"),
                "tok_per_cpu_s_x_over_off": statistics.median(cpu_ratios)
                if cpu_ratios
                else float("nan"),
                "tpot_off_over_x": statistics.median(tpot_ratios) if tpot_ratios else float("nan"),
            }
        )
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(SMOL_GGUF), help="model (default: the GGUF Q4_1)")
    ap.add_argument(
        "--sizes", default="1,4,16,64,256", help="concurrent sequences, comma-separated"
    )
    ap.add_argument("--workloads", default="grounded,chat")
    ap.add_argument(
        "--methods", default="off,ngram,suffix", help="of off,ngram,suffix,draft_self,draft_tiny"
    )
    ap.add_argument("--draft-k", type=int, default=3, help="num_speculative_tokens of draft_*")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument(
        "--max-prompt-tokens", type=int, default=None, help="cut prompts to this many tokens"
    )
    ap.add_argument("--kv-cache-gib", type=float, default=1.0, help="KV cache per engine")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default torch's)")
    ap.add_argument(
        "--repeats", type=int, default=1, help="interleaved rounds per batch size (median)"
    )
    ap.add_argument(
        "--chat-template",
        type=Path,
        default=None,
        help="a Jinja chat template file, for a tokenizer without one "
        "(Gemma 3 GGUF files: benches/gemma3_chat.jinja)",
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object last")
    args = ap.parse_args()
    template = args.chat_template.read_text() if args.chat_template else None
    if args.threads:
        torch.set_num_threads(args.threads)
    sizes = [int(s) for s in args.sizes.split(",")]
    methods = args.methods.split(",")
    if any(m.startswith("draft_") for m in methods):
        METHODS.update(draft_methods(args.model, args.draft_k, tempfile.mkdtemp()))
    engines: dict[str, LLM] = {}
    step_costs = None
    for m in methods:
        config = METHODS[m]
        if config is not None and config.get("draft_length_policy", "goodput") == "goodput":
            # One calibration: the later engines take the first one's costs.
            config = {**config, "draft_step_costs": step_costs}
        engines[m] = LLM(
            args.model,
            speculative_config=config,
            max_model_len=args.max_model_len,
            kv_cache_memory_bytes=int(args.kv_cache_gib * 2**30),
            max_num_seqs=max(sizes),
        )
        spec = engines[m].llm_engine.engine_core.scheduler.speculative_config()
        if spec is not None and spec["draft_step_costs"] is not None:
            step_costs = [list(p) for p in spec["draft_step_costs"]]
    tok = engines[methods[0]].get_tokenizer()
    results: list[dict[str, Any]] = []
    for workload in args.workloads.split(","):
        chats = WORKLOADS[workload](max(sizes))
        cut = args.max_model_len - args.max_tokens
        if args.max_prompt_tokens is not None:
            cut = min(cut, args.max_prompt_tokens)
        prompts = [chat_prompt_ids(tok, c, template)[:cut] for c in chats]
        for size in sizes:
            results += measure_size(engines, methods, prompts[:size], args.max_tokens,
                                    args.repeats, workload=workload, sequences=size)  # fmt: skip
    cpu = cpu_name()
    rows = [
        [
            r["workload"], r["sequences"], r["method"], r["tpot_ms"], r["tpot_off_over_x"],
            r["output_tok_per_s"], r["tok_per_s_x_over_off"], r["tok_per_cpu_s_x_over_off"],
            r["acceptance_rate"],
            r["mean_accepted_length"], r["identical_to_off"],
        ]
        for r in results
    ]  # fmt: skip
    print_table(
        f"speculative decoding, {Path(args.model).name}, {cpu}, "
        f"{torch.get_num_threads()} threads, greedy, max_tokens={args.max_tokens}",
        ["workload", "seqs", "method", "TPOT ms", "TPOT off/x", "out tok/s", "tok/s x/off",
         "tok/CPU-s x/off",
         "accept", "mean len", "identical"],
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
                        "max_prompt_tokens": args.max_prompt_tokens,
                        "chat_template": str(args.chat_template) if template else None,
                        "repeats": args.repeats,
                        "methods": {m: METHODS[m] for m in methods},
                        "draft_step_costs": step_costs,
                        "results": results,
                    }
                )
            )
        )


if __name__ == "__main__":
    main()
