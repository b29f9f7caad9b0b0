"""The engine's step time in-process against the same engine core in its own
process (``AsyncLLM``, as ``pagedrs serve`` runs it) and on a thread
(``engine_core_process=False``), for the same requests: does the server's
core step slower than the offline engine the planner is calibrated on?

Per workload (sequences, prompt tokens, output tokens; greedy, all added at
once): the in-process ``LLMEngine``'s median decode step
(``calibrate.measure_steps``); for the core process and the core thread the
median ``CoreOutputs.step_time`` (the core's own timing of a step), the
median interval between the core's outputs reaching the front end, and the
median gap between a request's streamed outputs at the caller; for the core
process its CPU seconds and seconds waiting for a CPU (every thread of it).

    taskset -c 1 python benches/planner_core_step.py [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from typing import Any

import numpy as np
import torch
from pagedrs import SamplingParams
from pagedrs.engine.arg_utils import EngineArgs
from pagedrs.engine.async_llm import AsyncLLM
from pagedrs.engine.llm_engine import LLMEngine
from pagedrs.plan.calibrate import measure_steps
from planner_engine import sched_times

ARGS = dict(
    dtype="float32", num_gpu_blocks_override=4096, max_model_len=2048, block_size=16,
    max_num_seqs=64, max_num_batched_tokens=2048, enable_prefix_caching=True,
)  # fmt: skip
WORK = [(1, 32, 48), (8, 32, 32), (24, 32, 24)]


def in_process() -> dict[str, Any]:
    eng = LLMEngine(EngineArgs(**ARGS))
    out = {}
    try:
        measure_steps(eng, [(4, 64, 8)], seed=1)  # warm-up
        for w in WORK:
            pts = measure_steps(eng, [w], seed=7)
            dec = [t for _, s, t in pts if s.num_prefill_tokens == 0]
            out[str(w)] = {"decode_step_p50_ms": 1e3 * float(np.median(dec)), "steps": len(dec)}
    finally:
        eng.shutdown()
    return out


def core(process: bool) -> dict[str, Any]:
    log: list[tuple[float, float]] = []
    orig = AsyncLLM._on_outputs

    def record(self: AsyncLLM, o: Any) -> None:
        log.append((time.perf_counter(), o.step_time))
        orig(self, o)

    AsyncLLM._on_outputs = record  # type: ignore[method-assign]
    try:
        llm = AsyncLLM(EngineArgs(**ARGS), torch_threads=1, engine_core_process=process)
    finally:
        AsyncLLM._on_outputs = orig  # type: ignore[method-assign]
    rng = np.random.default_rng(7)

    async def one(i: int, ids: list[int], n: int, tag: str, arr: list[list[float]]) -> None:
        p = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
        ts = []
        async for _ in llm.generate({"prompt_token_ids": ids}, p, f"{tag}-{i}", cache_salt=tag):
            ts.append(time.perf_counter())
        arr.append(ts)

    async def run(w: tuple[int, int, int], tag: str) -> list[list[float]]:
        n, plen, olen = w
        prompts = [rng.integers(100, 30000, size=plen).tolist() for _ in range(n)]
        arr: list[list[float]] = []
        await asyncio.gather(*(one(i, prompts[i], olen, tag, arr) for i in range(n)))
        return arr

    out = {}
    pid = llm.core_pid if process else None
    try:
        asyncio.run(run((4, 64, 8), "warm"))
        for w in WORK:
            log.clear()
            c0 = sched_times(pid) if pid else None
            arr = asyncio.run(run(w, f"{process}{w}"))
            c1 = sched_times(pid) if pid else None
            gaps = np.concatenate([np.diff(a) for a in arr if len(a) > 2])
            stamps = [t for t, s in log if s > 0]
            step = [s for _, s in log if s > 0]
            row = {
                "core_step_p50_ms": 1e3 * float(np.median(step[2:])),  # past the prefill
                "core_steps": len(step),
                "output_interval_p50_ms": 1e3 * float(np.median(np.diff(stamps)[2:])),
                "caller_gap_p50_ms": 1e3 * float(np.median(gaps)),
            }
            if c0 and c1:
                row |= {"core_cpu_s": c1[0] - c0[0], "core_cpu_wait_s": c1[1] - c0[1]}
            out[str(w)] = row
    finally:
        llm.shutdown()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", action="store_true")
    ns = ap.parse_args()
    torch.set_num_threads(1)
    res: dict[str, Any] = {"cpu_affinity": sorted(os.sched_getaffinity(0))}
    res["load_average"] = os.getloadavg()[0]
    res["in_process"] = in_process()
    res["core_process"] = core(True)
    res["core_thread"] = core(False)
    res["load_average_after"] = os.getloadavg()[0]
    print(json.dumps(res, indent=None if ns.json else 1))


if __name__ == "__main__":
    main()
