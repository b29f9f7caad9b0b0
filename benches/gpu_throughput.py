"""End-to-end offline throughput of a real-shaped model with random weights
(``load_format="dummy"``), eager vs CUDA graphs, and where a decode step's
time goes.

For each mode (``--modes``, each in a process of its own so the GPU memory
starts clean) and each batch (``--num-seqs``): ``LLM.generate`` of that many
random token-id prompts of ``--prompt-len`` tokens, ``--output-len`` new
tokens each (``ignore_eos``), timed after a warm-up. Then a shorter run with
each part of the step timed (the device synchronized around each):

  schedule     the Rust scheduler's ``schedule()``
  step arrays  the step's metadata and inputs to the device (eager:
               ``AttentionMetadata.for_groups`` and the id/position copies;
               graphs: the copies into the static buffers)
  forward      the model (``ModelRunner.execute`` less its step arrays)
  sample       the sampler
  other        the rest of the step (update, outputs, detokenization)

Figures are per decode step (steps with one new token per sequence), in ms.

    python benches/gpu_throughput.py [--model llama3-8b] [--num-seqs 64 256] [--json]
    python benches/gpu_throughput.py --cpu-dry-run   # tiny shapes on CPU: a test
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_models  # noqa: E402

#: --cpu-dry-run: the model's config shrunk to this.
DRY_RUN_SHAPE = {
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 512,
}


class Timings:
    """Seconds spent per part of each step, device-synchronized."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.parts: dict[str, list[float]] = defaultdict(list)
        self.decode = False

    def sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    def wrap(self, name: str, fn: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            self.sync()
            t = time.perf_counter()
            out = fn(*args, **kwargs)
            self.sync()
            self.parts[name].append(time.perf_counter() - t)
            return out

        return timed


class _Proxy:
    """Forwards attributes to ``inner`` except those set on the proxy."""

    def __init__(self, inner: Any) -> None:
        self.__dict__["_inner"] = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_inner"], name)


def instrument(llm: Any, timings: Timings) -> None:
    """Time schedule / step arrays / execute / sample of ``llm``'s steps (decode
    steps only are kept: ``timings.decode`` marks them)."""
    from pagedrs.attention import metadata
    from pagedrs.executor import cuda_graphs, model_runner

    engine = llm.llm_engine
    sched = _Proxy(engine.engine_core.scheduler)
    real_schedule = engine.engine_core.scheduler.schedule

    def schedule() -> Any:
        timings.sync()
        t = time.perf_counter()
        out = real_schedule()
        timings.sync()
        if out is not None:
            batch = out.batch
            timings.decode = batch.num_tokens == len(batch.seq_lens) and batch.num_tokens > 0
            timings.parts["schedule"].append(time.perf_counter() - t)
        return out

    sched.__dict__["schedule"] = schedule
    engine.engine_core.scheduler = sched
    engine.engine_core.runner.execute = timings.wrap("execute", engine.engine_core.runner.execute)
    engine.engine_core.sampler = timings.wrap("sample", engine.engine_core.sampler)
    for_groups = metadata.AttentionMetadata.for_groups.__func__

    def timed_for_groups(cls: Any, batch: Any, device: Any) -> Any:
        return timings.wrap("step_arrays", lambda: for_groups(cls, batch, device))()

    model_runner.AttentionMetadata.for_groups = classmethod(timed_for_groups)  # type: ignore[method-assign]
    cuda_graphs._fill = timings.wrap("step_arrays", cuda_graphs._fill)


def breakdown(steps: list[dict[str, float]]) -> dict[str, float]:
    """Mean ms per decode step of each part (``steps``: seconds per part of
    each step, and "decode": 1.0 for decode steps)."""
    decode = [st for st in steps if st.get("decode")]
    if not decode:
        return {}

    def mean(key: str) -> float:
        return statistics.mean(st.get(key, 0.0) for st in decode) * 1e3

    out = {
        "schedule": mean("schedule"),
        "step_arrays": mean("step_arrays"),
        "forward": mean("execute") - mean("step_arrays"),
        "sample": mean("sample"),
        "total": mean("wall"),
    }
    out["other"] = out["total"] - out["schedule"] - out["forward"]
    out["other"] -= out["step_arrays"] + out["sample"]
    out["steps"] = len(decode)
    return out


def run_mode(args: argparse.Namespace) -> dict[str, Any]:
    """One mode's figures, in this process."""
    from pagedrs import LLM, SamplingParams
    from pagedrs.executor.cuda_graphs import EagerReplay

    device = "cpu" if args.cpu_dry_run else "cuda"
    root = Path(tempfile.mkdtemp(prefix="pagedrs-shapes-"))
    overrides = dict(DRY_RUN_SHAPE) if args.cpu_dry_run else {}
    if args.cpu_dry_run and gpu_models.SHAPES[args.model][0] != "qwen3":
        overrides.pop("head_dim")
    folder = gpu_models.config_folder(args.model, root, **overrides)
    max_len = args.prompt_len + args.output_len
    eager = args.mode == "eager"
    t0 = time.perf_counter()
    kw: dict[str, Any] = {}
    if args.cpu_dry_run:
        kw["num_gpu_blocks_override"] = 4 * max(args.num_seqs) * (-(-max_len // 16))
    llm = LLM(
        str(folder),
        load_format="dummy",
        device=device,
        max_model_len=max_len,
        max_num_seqs=max(args.num_seqs),
        enforce_eager=eager,
        gpu_memory_utilization=args.gpu_memory_utilization,
        **kw,
    )
    runner = llm.llm_engine.engine_core.runner
    if args.cpu_dry_run and not eager:
        runner.capture_cuda_graphs(max(args.num_seqs), max_len, capturer=EagerReplay())
    start_s = time.perf_counter() - t0
    params = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)
    vocab = llm.llm_engine.engine_core.model.config.vocab_size

    def generate(n: int, out_len: int, seed: int) -> float:
        prompts = gpu_models.random_prompts(n, args.prompt_len, vocab, seed=seed)
        p = SamplingParams(temperature=0.0, max_tokens=out_len, ignore_eos=True)
        if device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        outs = llm.generate([{"prompt_token_ids": q} for q in prompts], p, use_tqdm=False)
        if device == "cuda":
            torch.cuda.synchronize()
        assert all(len(o.outputs[0].token_ids) == out_len for o in outs)
        return time.perf_counter() - t

    generate(min(4, max(args.num_seqs)), 4, seed=99)  # warm-up: compiles kernels
    result: dict[str, Any] = {
        "mode": args.mode,
        "model": args.model,
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "start_s": start_s,
        "graphs": runner.graphs is not None,
        "graph_sizes": runner.graphs.sizes if runner.graphs is not None else [],
        "num_blocks": llm.kv_cache_stats()["num_total_blocks"],
        "prompt_len": args.prompt_len,
        "output_len": args.output_len,
        "runs": {},
    }
    for n in args.num_seqs:
        secs = generate(n, args.output_len, seed=n)
        result["runs"][str(n)] = {
            "elapsed_s": secs,
            "output_tokens_per_s": n * args.output_len / secs,
            "total_tokens_per_s": n * (args.prompt_len + args.output_len) / secs,
        }
        print(
            f"[{args.mode}] {n} seqs: {n * args.output_len / secs:.0f} output tokens/s "
            f"({secs:.2f}s)",
            flush=True,
        )
    # Step breakdown: a shorter instrumented run per batch.
    timings = Timings(device)
    instrument(llm, timings)
    engine = llm.llm_engine
    real_step = engine.step
    steps: list[dict[str, float]] = []

    def step() -> Any:
        timings.parts.clear()
        timings.decode = False
        t = time.perf_counter()
        out = real_step()
        timings.sync()
        record = {k: sum(v) for k, v in timings.parts.items()}
        record.update(wall=time.perf_counter() - t, decode=float(timings.decode))
        steps.append(record)
        return out

    engine.step = step  # type: ignore[method-assign]
    for n in args.num_seqs:
        steps.clear()
        generate(n, args.breakdown_tokens, seed=1000 + n)
        result["runs"][str(n)]["decode_step_ms"] = breakdown(steps)
    del params
    llm.shutdown()
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama3-8b", choices=list(gpu_models.SHAPES))
    ap.add_argument("--num-seqs", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--breakdown-tokens", type=int, default=32, help="new tokens, timed run")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    ap.add_argument("--modes", nargs="+", default=["eager", "cuda_graphs"])
    ap.add_argument("--mode", default=None, help=argparse.SUPPRESS)  # one mode, in process
    ap.add_argument("--cpu-dry-run", action="store_true", help="tiny shapes on CPU: a test")
    ap.add_argument("--json", action="store_true", help="print one JSON object last")
    args = ap.parse_args()
    if not args.cpu_dry_run and not torch.cuda.is_available():
        print("gpu_throughput: no CUDA GPU: skipping (use --cpu-dry-run to test the script)")
        if args.json:
            print(json.dumps({"skipped": "no CUDA GPU"}))
        return 0
    if args.cpu_dry_run and args.num_seqs == [64, 256]:
        args.num_seqs, args.prompt_len, args.output_len, args.breakdown_tokens = [4, 8], 8, 8, 4
    if args.mode is not None:
        print(json.dumps(run_mode(args)))
        return 0
    results: dict[str, Any] = {}
    for mode in args.modes:
        cmd = [sys.executable, __file__, "--mode", mode] + [
            a for a in sys.argv[1:] if a not in ("--json",)
        ]
        if "--modes" in cmd:  # drop --modes and its values
            i = cmd.index("--modes")
            j = i + 1
            while j < len(cmd) and not cmd[j].startswith("--"):
                j += 1
            del cmd[i:j]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        sys.stdout.write(proc.stdout[: proc.stdout.rfind("\n{")] if "\n{" in proc.stdout else "")
        if proc.returncode != 0:
            print(proc.stdout[-4000:], proc.stderr[-8000:], sep="\n")
            results[mode] = {"error": f"exit {proc.returncode}: {proc.stderr.strip()[-500:]}"}
            continue
        results[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
    rows = []
    for mode, r in results.items():
        if "error" in r:
            rows.append(f"{mode:<12} ERROR {r['error']}")
            continue
        for n, run in r["runs"].items():
            b = run.get("decode_step_ms", {})
            parts = " ".join(
                f"{k} {b[k]:.2f}"
                for k in ("schedule", "step_arrays", "forward", "sample", "other")
                if k in b
            )
            rows.append(
                f"{mode:<12} {n:>4} seqs {run['output_tokens_per_s']:>9.0f} tok/s   decode step "
                f"{b.get('total', float('nan')):.2f} ms = {parts}"
            )
    print(
        f"\n{args.model}, prompt {args.prompt_len} + output {args.output_len} tokens, "
        "random weights (load_format=dummy)"
    )
    print("\n".join(rows))
    if args.json:
        print(json.dumps({"model": args.model, "modes": results}))
    return 0 if all("error" not in r for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
