"""bfloat16 projections on CPU: plain weights (``F.linear`` / ``torch.addmm``, what
HF's modules call) against weights prepacked once for oneDNN
(``pagedrs.executor.models.linear``), by tokens per step.

The default model's own weights in bfloat16: per step all 30 layers' four
projections (fused QKV, output with the residual added, fused gate/up, down with
the residual added) and the LM head, on random ``[M, hidden]`` inputs. Its ~270 MB
of weights do not fit in cache, so each step streams them from memory as a
model's step does. The two ways alternate ``--rounds`` times in one process;
each figure is the best round's median step time.

    python benches/bench_linear.py [--tokens 1,4,16,64,256,2048] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch
from common import json_safe, print_table
from pagedrs.executor.model_loader import hf_folder
from pagedrs.executor.model_registry import DEFAULT_MODEL
from pagedrs.executor.models import PagedLlamaModel
from pagedrs.executor.models.linear import Linear, can_pack
from transformers import AutoModelForCausalLM


def step_fn(model: PagedLlamaModel, m: int, packed: bool) -> Callable[[], None]:
    """One step's projections over ``m`` tokens, packed or plain."""
    hidden = model.layers[0].o_proj.weight.shape[0]
    inter = model.layers[0].down_proj.weight.shape[1]
    x = torch.randn(m, hidden, dtype=torch.bfloat16)
    mid = torch.randn(m, inter, dtype=torch.bfloat16)
    attn = torch.randn(m, model.layers[0].o_proj.weight.shape[1], dtype=torch.bfloat16)

    def way(lin: Linear) -> Linear:
        return lin if packed else Linear(lin.weight, lin.bias, pack=False)

    layers = [
        (way(lr.qkv), way(lr.o_proj), way(lr.gate_up), way(lr.down_proj)) for lr in model.layers
    ]
    head = way(model.lm_head)

    def run() -> None:
        with torch.inference_mode():
            for qkv, o, gate_up, down in layers:
                qkv(x)
                o.add_to(x, attn)
                gate_up(x)
                down.add_to(x, mid)
            head(x)

    return run


def median_time(fn: Callable[[], None], reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--tokens", default="1,4,16,64,256,2048", help="tokens per step, comma list")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="print one JSON object last")
    args = ap.parse_args()
    hf = AutoModelForCausalLM.from_pretrained(hf_folder(DEFAULT_MODEL), dtype=torch.bfloat16).eval()
    model = PagedLlamaModel(hf, max_positions=64)
    if not can_pack(model.layers[0].qkv.weight):
        raise SystemExit("this torch has no oneDNN weight packing: nothing to compare")
    flop_per_token = (
        2
        * sum(
            lin.weight.numel()
            for lr in model.layers
            for lin in (lr.qkv, lr.o_proj, lr.gate_up, lr.down_proj)
        )
        + 2 * model.lm_head.weight.numel()
    )
    rows, figures = [], {}
    for m in [int(t) for t in args.tokens.split(",")]:
        reps = max(3, min(30, 2048 // m))
        best = {"plain": float("inf"), "packed": float("inf")}
        for _ in range(args.rounds):
            for way in best:
                t = median_time(step_fn(model, m, way == "packed"), reps)
                best[way] = min(best[way], t)
        ratio = best["plain"] / best["packed"]
        gflops = {k: flop_per_token * m / v / 1e9 for k, v in best.items()}
        rows.append(
            [m, best["plain"] * 1e3, best["packed"] * 1e3, gflops["plain"], gflops["packed"], ratio]
        )
        figures[str(m)] = {
            "plain_ms": best["plain"] * 1e3,
            "packed_ms": best["packed"] * 1e3,
            "speedup": ratio,
        }
    print_table(
        f"bfloat16 projections of {DEFAULT_MODEL} per step (30 layers + LM head), "
        f"{torch.get_num_threads()} threads",
        ["tokens", "plain ms", "packed ms", "plain GFLOP/s", "packed GFLOP/s", "speedup"],
        rows,
    )
    if args.json:
        print(json.dumps(json_safe({"threads": torch.get_num_threads(), "tokens": figures})))


if __name__ == "__main__":
    main()
