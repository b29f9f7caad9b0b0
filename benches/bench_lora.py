"""Multi-LoRA throughput: 64 sequences at once, each with one of 1, 8 or 64
distinct adapters (rank 8, 16 and 64), against the base model in the same
run (S-LoRA / Punica's comparison; the issue's goal: 64 distinct rank-16
adapters at >= 0.8x the base model's tokens/s).

The model is the default (SmolLM2-135M-Instruct, float32). Adapters are
random PEFT folders of ``--targets`` (default ``q_proj,v_proj``, PEFT's
default for Llama) written with safetensors. Each configuration runs
``--prompts`` Alpaca prompts as chats, ``--max-tokens`` greedy tokens each
(EOS ignored, so every run generates the same tokens); request ``i`` uses
adapter ``i % D``. Rows: the base engine (``enable_lora`` off), the LoRA
engine with no adapter in the batch, then each (rank, D). Tokens/s is output
tokens over the wall time of ``LLM.chat`` (prefill included), the median of
``--reps`` runs, runs of a rank alternated with its base.

    python benches/bench_lora.py [--ranks 8,16,64] [--distinct 1,8,64] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from bench_dense_linear import cpu_name
from common import alpaca_prompts, json_safe, print_table
from pagedrs import LLM, LoRARequest, SamplingParams
from pagedrs.lora.memory import lora_reserved_bytes
from safetensors.torch import save_file

COMMON: dict[str, Any] = {
    "dtype": "float32",
    "max_model_len": 1024,
    "max_num_seqs": 64,
    "enable_prefix_caching": False,  # every run computes its prompts
    "kv_cache_memory_bytes": 512 << 20,
}


def write_adapter(folder: Path, config: Any, rank: int, targets: list[str], seed: int) -> Path:
    """A random PEFT LoRA folder for ``config``'s decoder (A ~ U(-1/sqrt(K),
    1/sqrt(K)) as PEFT's Kaiming init, B ~ N(0, 0.01))."""
    g = torch.Generator().manual_seed(seed)
    hidden, heads = config.hidden_size, config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    kv = config.num_key_value_heads * head_dim
    shapes = {
        "q_proj": (hidden, heads * head_dim),
        "k_proj": (hidden, kv),
        "v_proj": (hidden, kv),
        "o_proj": (heads * head_dim, hidden),
        "gate_proj": (hidden, config.intermediate_size),
        "up_proj": (hidden, config.intermediate_size),
        "down_proj": (config.intermediate_size, hidden),
    }
    tensors = {}
    for layer in range(config.num_hidden_layers):
        for t in targets:
            k, n = shapes[t]
            part = "mlp" if t in ("gate_proj", "up_proj", "down_proj") else "self_attn"
            key = f"base_model.model.model.layers.{layer}.{part}.{t}"
            bound = 1 / k**0.5
            tensors[f"{key}.lora_A.weight"] = (torch.rand(rank, k, generator=g) * 2 - 1) * bound
            tensors[f"{key}.lora_B.weight"] = torch.randn(n, rank, generator=g) * 0.01
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    cfg = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": targets}
    (folder / "adapter_config.json").write_text(json.dumps(cfg))
    return folder


def run(llm: LLM, prompts: list[Any], params: SamplingParams, loras: list[Any] | None) -> float:
    """Output tokens/s of one ``LLM.chat`` of every prompt."""
    t0 = time.perf_counter()
    outs = llm.chat(prompts, params, use_tqdm=False, lora_request=loras)
    dt = time.perf_counter() - t0
    return sum(len(o.outputs[0].token_ids) for o in outs) / dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ints = lambda s: [int(v) for v in s.split(",")]  # noqa: E731
    ap.add_argument("--ranks", type=ints, default=[8, 16, 64])
    ap.add_argument("--distinct", type=ints, default=[1, 8, 64])
    ap.add_argument("--targets", default="q_proj,v_proj")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    targets = args.targets.split(",")
    prompts = [[{"role": "user", "content": p}] for p in alpaca_prompts(args.prompts)]
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    base = LLM(**COMMON)
    model = base.llm_engine.engine_core.model
    config = model.config
    most = max(args.distinct)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for rank in args.ranks:
            folders = [
                write_adapter(Path(tmp) / f"r{rank}-{i}", config, rank, targets, i)
                for i in range(most)
            ]
            loras = [LoRARequest(f"r{rank}-{i}", i + 1, str(f)) for i, f in enumerate(folders)]
            # The adapters' bound is set aside from the KV budget (lora.memory):
            # the LoRA engine's budget adds it, so its KV pool is the base engine's.
            reserved = lora_reserved_bytes(model, most, rank, most)
            llm = LLM(
                enable_lora=True,
                max_loras=most,
                max_cpu_loras=most,
                max_lora_rank=rank,
                **{**COMMON, "kv_cache_memory_bytes": COMMON["kv_cache_memory_bytes"] + reserved},
            )
            run(llm, prompts, params, [loras[i % most] for i in range(len(prompts))])  # load all
            times: dict[str, list[float]] = {}
            for _ in range(args.reps):
                times.setdefault("base", []).append(run(base, prompts, params, None))
                times.setdefault("lora engine, no adapter", []).append(
                    run(llm, prompts, params, None)
                )
                for d in args.distinct:
                    per = [loras[i % d] for i in range(len(prompts))]
                    times.setdefault(f"{d} adapters", []).append(run(llm, prompts, params, per))
            stats = llm.kv_cache_stats()
            base_tok_s = statistics.median(times["base"])
            for label, values in times.items():
                tok_s = statistics.median(values)
                rows.append(
                    {
                        "rank": rank,
                        "config": label,
                        "tok_s": tok_s,
                        "vs_base": tok_s / base_tok_s,
                        "lora_bytes": stats["lora_bytes"],
                        "lora_slot_bytes": stats["lora_slot_bytes"],
                    }
                )
            llm.llm_engine.shutdown()
            del llm
    cpu = cpu_name()
    print_table(
        f"{args.prompts} sequences x {args.max_tokens} tokens, targets {args.targets}, "
        f"{torch.get_num_threads()} thread(s), {cpu}",
        ["rank", "config", "tok/s", "vs base", "adapter MiB", "slot MiB"],
        [
            [
                r["rank"],
                r["config"],
                r["tok_s"],
                r["vs_base"],
                r["lora_bytes"] / 2**20,
                r["lora_slot_bytes"] / 2**20,
            ]
            for r in rows
        ],
    )
    if args.json:
        print(json.dumps(json_safe({"cpu": cpu, "rows": rows, "args": vars(args)})))


if __name__ == "__main__":
    main()
