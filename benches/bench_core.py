"""CPU time per engine step spent in the Rust core (scheduling, block allocation,
block hashing, building the step's arrays, applying sampled tokens), measured
through the Python API the engine uses (so the PyO3 crossing is included).

Workloads (prefix caching on, block size 16):
* decode: 16, 256 and 1024 running sequences with 128-token prompts, one new
  token each per step;
* prefill-heavy: 256 prompts of 1024 tokens sharing a 512-token prefix, token
  budget 8192 per step.

When vLLM is importable (``--vllm-python`` points to an interpreter that has
it), the same workloads run on vLLM's own v1 KV cache manager and scheduler
(``vllm/v1/core``) in a subprocess, and the ratio is printed.

    python benches/bench_core.py [--steps 200] [--vllm-python PATH] [--json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

BLOCK_SIZE = 16
DECODE_SIZES = (16, 256, 1024)
PROMPT_LEN = 128
PREFILL_PROMPTS, PREFILL_LEN, PREFILL_SHARED, PREFILL_BUDGET = 256, 1024, 512, 8192


def _pagedrs_scheduler(max_num_seqs: int, budget: int, num_blocks: int):
    from pagedrs._core import Scheduler

    return Scheduler(num_blocks, BLOCK_SIZE, max_num_seqs, budget, 4096, enable_prefix_caching=True)


def pagedrs_decode(num_seqs: int, steps: int) -> float:
    """Seconds of CPU per decode step with ``num_seqs`` running sequences."""
    rng = np.random.default_rng(0)
    blocks = num_seqs * ((PROMPT_LEN + steps + 8) // BLOCK_SIZE + 2)
    sched = _pagedrs_scheduler(num_seqs, max(8192, num_seqs * PROMPT_LEN), blocks)
    for i in range(num_seqs):
        prompt = rng.integers(3, 50000, PROMPT_LEN)
        sched.add_request(i, prompt, steps + 10, [2])
    out = sched.schedule()  # prefill everything in one step (not timed)
    sched.update(rng.integers(3, 50000, out.batch.num_sampled_tokens))
    tokens = rng.integers(3, 50000, (steps, num_seqs))
    t0 = time.process_time()
    for s in range(steps):
        out = sched.schedule()
        sched.update(tokens[s, : out.batch.num_sampled_tokens])
    return (time.process_time() - t0) / steps


def pagedrs_prefill() -> tuple[float, int]:
    """(CPU seconds per step, steps) to prefill 256 prompts sharing a prefix."""
    rng = np.random.default_rng(1)
    shared = rng.integers(3, 50000, PREFILL_SHARED)
    blocks = PREFILL_PROMPTS * (PREFILL_LEN // BLOCK_SIZE + 2)
    sched = _pagedrs_scheduler(PREFILL_PROMPTS, PREFILL_BUDGET, blocks)
    prompts = [
        np.concatenate([shared, rng.integers(3, 50000, PREFILL_LEN - PREFILL_SHARED)])
        for _ in range(PREFILL_PROMPTS)
    ]
    t0 = time.process_time()
    for i, p in enumerate(prompts):
        sched.add_request(i, p, 64, [2])
    steps = prefilled = 0
    while prefilled < PREFILL_PROMPTS:
        out = sched.schedule()
        steps += 1
        prefilled += int((out.batch.num_output_tokens == 0).sum())
        sched.update(np.full(out.batch.num_sampled_tokens, 7))
    return (time.process_time() - t0) / steps, steps


def run_vllm(python: str, steps: int) -> dict | None:
    """The same workloads on vLLM's v1 core, in ``python`` (None if unavailable)."""
    script = Path(__file__).with_name("vllm_core_peer.py")
    proc = subprocess.run(
        [python, str(script), "--steps", str(steps)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        print(f"vLLM peer unavailable: {proc.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--vllm-python", default=None, help="interpreter with vLLM installed")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    ours = {f"decode_{n}": pagedrs_decode(n, args.steps) for n in DECODE_SIZES}
    ours["prefill_shared"], prefill_steps = pagedrs_prefill()
    peer = run_vllm(args.vllm_python, args.steps) if args.vllm_python else None

    rows = []
    for key, sec in ours.items():
        n = int(key.split("_")[1]) if key.startswith("decode") else PREFILL_PROMPTS
        row = [key, n, sec * 1e6, sec * 1e6 / n]
        if peer and key in peer:
            row += [peer[key] * 1e6, peer[key] / sec]
        else:
            row += ["-", "-"]
        rows.append(row)
    from common import print_table

    print_table(
        f"Rust core CPU time per step (block size {BLOCK_SIZE}, prefix caching on; "
        f"prefill: {PREFILL_PROMPTS} x {PREFILL_LEN} tokens sharing {PREFILL_SHARED}, "
        f"{prefill_steps} steps)",
        ["workload", "seqs", "us/step", "us/seq/step", "vLLM us/step", "vLLM / pagedrs"],
        rows,
    )
    if args.json:
        print(json.dumps({"pagedrs_s_per_step": ours, "vllm_s_per_step": peer}))


if __name__ == "__main__":
    main()
