"""Tiny-model zoo on the device: pagedrs' greedy tokens against HF transformers'
own ``generate`` (float32, eager attention) on the same device, with CUDA
graphs (the default on a GPU) and with ``enforce_eager=True``.

Each model of ``gpu_models.TINY_ZOO`` (random weights, saved once) answers
token-id prompts of 5 to 60 tokens, so with 24 new tokens the longest pass
the zoo's 40-token sliding window. Where the two differ, a step whose HF top-2
logits tie within ``--tie`` ends the comparison of that output (not a
failure). A model counts as equal when every output of both modes matches.

    python benches/gpu_zoo.py [--models llama qwen3 ...] [--json]
    python benches/gpu_zoo.py --cpu-dry-run   # the same code on CPU, tiny and slow

``--cpu-dry-run`` runs on the CPU with the graphs' stand-in capturer
(``cuda_graphs.EagerReplay``): a test of this script, not a measurement.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_models  # noqa: E402

PROMPT_LENGTHS = (5, 17, 33, 60)
MAX_TOKENS = 24
MAX_NUM_SEQS = 16


def hf_reference(
    folder: Path, prompts: list[list[int]], device: torch.device, max_tokens: int
) -> list[tuple[list[int], list[torch.Tensor]]]:
    """HF's greedy tokens and per-step logits for each prompt."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager"
    ).to(device)
    model.eval()
    out = []
    for p in prompts:
        ids = torch.tensor([p], device=device)
        with torch.no_grad():
            gen = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_tokens,
                do_sample=False,
                pad_token_id=0,
                output_scores=True,
                return_dict_in_generate=True,
            )
        tokens = gen.sequences[0, len(p) :].tolist()
        out.append((tokens, [s[0].float().cpu() for s in gen.scores]))
    del model
    return out


def agree(got: list[int], ref: tuple[list[int], list[torch.Tensor]], tie: float) -> bool:
    """Equal tokens, up to the first step where HF's top-2 logits tie."""
    tokens, scores = ref
    for i, (a, b) in enumerate(zip(got, tokens, strict=False)):
        if a != b:
            top = scores[i].topk(2).values
            return bool(top[0] - top[1] <= tie)
    return len(got) == len(tokens)


def run_engine(
    folder: Path, prompts: list[list[int]], device: str, eager: bool, cpu_dry_run: bool, **kw: Any
) -> tuple[list[list[int]], dict[str, Any]]:
    """pagedrs' greedy tokens, and what the engine ran (graphs, replays)."""
    from pagedrs import LLM, SamplingParams
    from pagedrs.executor.cuda_graphs import EagerReplay

    llm = LLM(
        str(folder),
        dtype="float32",
        device=device,
        max_model_len=128,
        max_num_seqs=MAX_NUM_SEQS,
        num_gpu_blocks_override=256,
        enforce_eager=eager,
        **kw,
    )
    runner = llm.llm_engine.engine_core.runner
    if cpu_dry_run and not eager:
        runner.capture_cuda_graphs(MAX_NUM_SEQS, 128, capturer=EagerReplay())
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    info = {
        "graphs": runner.graphs is not None,
        "replays": sum(runner.graphs.replays.values()) if runner.graphs is not None else 0,
        "backend": runner.attention.name,
    }
    stats = llm.kv_cache_stats()
    info["all_blocks_free"] = stats["num_free_blocks"] == stats["num_total_blocks"]
    llm.shutdown()
    del llm, runner
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return [list(o.outputs[0].token_ids) for o in outs], info


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=list(gpu_models.TINY_ZOO))
    ap.add_argument("--tie", type=float, default=1e-4, help="HF top-2 logit gap counted a tie")
    ap.add_argument("--cpu-dry-run", action="store_true", help="CPU, stand-in graphs: a test")
    ap.add_argument("--attention-backend", default="auto")
    ap.add_argument("--json", action="store_true", help="print one JSON object last")
    args = ap.parse_args()
    if not args.cpu_dry_run and not torch.cuda.is_available():
        print("gpu_zoo: no CUDA GPU: skipping (use --cpu-dry-run to test the script)")
        if args.json:
            print(json.dumps({"skipped": "no CUDA GPU"}))
        return 0
    device = "cpu" if args.cpu_dry_run else "cuda"
    root = Path(tempfile.mkdtemp(prefix="pagedrs-zoo-"))
    vocab = gpu_models.TINY_ZOO[args.models[0]][1]["vocab_size"]
    prompts = [gpu_models.random_prompts(1, n, vocab, seed=n)[0] for n in PROMPT_LENGTHS]
    rows, results = [], {}
    for name in args.models:
        t0 = time.perf_counter()
        try:
            folder = gpu_models.tiny_folder(name, root)
            refs = hf_reference(folder, prompts, torch.device(device), MAX_TOKENS)
            modes = {}
            for mode, eager in (("cuda_graphs", False), ("eager", True)):
                got, info = run_engine(
                    folder,
                    prompts,
                    device,
                    eager,
                    args.cpu_dry_run,
                    attention_backend=args.attention_backend,
                )
                ok = [agree(g, r, args.tie) for g, r in zip(got, refs, strict=True)]
                modes[mode] = {"equal": sum(ok), "of": len(ok), **info}
            equal = all(m["equal"] == m["of"] and m["all_blocks_free"] for m in modes.values())
            results[name] = {"equal": equal, "modes": modes}
        except Exception as exc:  # one model's failure is reported, the rest still run
            results[name] = {"equal": False, "error": f"{type(exc).__name__}: {exc}"}
        r = results[name]
        secs = time.perf_counter() - t0
        if "error" in r:
            rows.append(f"{name:<12} ERROR {r['error'][:200]} ({secs:.1f}s)")
        else:
            g, e = r["modes"]["cuda_graphs"], r["modes"]["eager"]
            rows.append(
                f"{name:<12} {'equal' if r['equal'] else 'DIFFERENT':<9} graphs "
                f"{g['equal']}/{g['of']} (captured: {g['graphs']}, {g['replays']} replays, "
                f"{g['backend']}), eager {e['equal']}/{e['of']} ({secs:.1f}s)"
            )
        print(rows[-1], flush=True)
    k = sum(r["equal"] for r in results.values())
    summary = f"{k}/{len(results)}"
    print(f"\nzoo greedy equality vs HF on {device}: {summary} models equal")
    if args.json:
        print(json.dumps({"device": device, "zoo_equal": summary, "models": results}))
    return 0 if k == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
