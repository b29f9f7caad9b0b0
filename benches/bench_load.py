"""Load time, time to the first token and peak memory of a GGUF file: pagedrs
against llama.cpp.

Per file and per engine, a fresh subprocess loads the model, then generates
one greedy token for a short prompt, and reports wall seconds to the model
being ready (``seconds``) and to that first token (``first_token_seconds``),
CPU seconds to both (user + system, all threads: the figure that holds on a
shared, loaded machine; ``cpu_seconds``, ``first_token_cpu_seconds``) and
the peak resident set (``VmHWM`` from ``/proc/self/status``, the mapped
file's resident pages included), each from after the imports (torch,
transformers, pagedrs, llama_cpp):

- ``pagedrs``: ``LLM(model=FILE, max_model_len=256)`` with a 96 MiB KV cache
  (256 tokens of the 8B shape in float32): config, tokenizer and the quantized
  weights (``executor/quant/gguf_loader.py``);
- ``llama.cpp``: ``llama_cpp.Llama(FILE, n_ctx=512)`` (llama-cpp-python), the
  file memory-mapped, its tokenizer built.

Each engine loads each file twice (``first``, ``second``). pagedrs' first
load starts without the file's entry in its GGUF metadata cache
(``executor/gguf_cache.py``: the header's parse, config, tokenizer, special
tokens and value check, saved on the first load); the second reads it.
llama.cpp keeps no cache of its own: its two loads show the run-to-run
spread. The file is read once before the runs, so every load finds it in the
page cache. ``--repeat N`` runs the whole sequence N times, interleaved, and
reports for each load the run of median wall time to the first token (every
run under ``runs`` in the JSON).

``--trees NAME=PYTHONPATH ...`` runs pagedrs from several source trees (e.g. a
checkout of main and this one), interleaved per file, so that a change to the
load path is measured against its base in the same run. Files are those of
``bench_quantized.MODELS`` (``--models``).

    python benches/bench_load.py [--models smollm2 gemma3 1b 8b] [--trees a=... b=...]
        [--engines pagedrs llama.cpp] [--repeat N] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench_quantized import GGUF_DIR, MODELS, cpu_name, cpu_seconds, proc_status
from common import json_safe, print_table

KV_BYTES = 96 << 20
PROMPT = "The capital of France is"


def worker(engine: str, path: str) -> dict[str, Any]:
    """Load ``path`` with ``engine`` in this process; the timings."""
    if engine == "pagedrs":
        from pagedrs import LLM

        def load() -> Any:
            return LLM(model=path, max_model_len=256, kv_cache_memory_bytes=KV_BYTES)
    else:
        import llama_cpp

        def load() -> Any:
            return llama_cpp.Llama(path, n_ctx=512, verbose=False)

    before = proc_status()
    t, c = time.perf_counter(), cpu_seconds()
    model = load()
    out = {
        "seconds": time.perf_counter() - t,
        "cpu_seconds": cpu_seconds() - c,
        "before_load": before,
        "after_load": proc_status(),
    }
    if engine == "pagedrs":
        from pagedrs import SamplingParams

        params = SamplingParams(temperature=0.0, max_tokens=1)
        token = model.generate([PROMPT], params, use_tqdm=False)[0].outputs[0].token_ids
    else:
        token = model(PROMPT, max_tokens=1, temperature=0.0)["choices"][0]["text"]
    out["first_token_seconds"] = time.perf_counter() - t
    out["first_token_cpu_seconds"] = cpu_seconds() - c
    out["first_token"] = token
    del model
    return out


def clear_metadata_cache(path: Path, pythonpath: str | None) -> None:
    """Remove GGUF ``path``'s entry from pagedrs' metadata cache (in a
    subprocess, with the tree's ``gguf_cache``)."""
    code = (
        "import shutil, sys; from pagedrs.executor import gguf_cache; "
        "shutil.rmtree(gguf_cache.entry(sys.argv[1], 'x').parent, ignore_errors=True)"
    )
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    subprocess.run([sys.executable, "-c", code, str(path)], check=True, env=env)


def run_worker(engine: str, path: Path, pythonpath: str | None) -> dict[str, Any]:
    """One load in a fresh subprocess (``pythonpath`` for pagedrs' tree)."""
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", engine, str(path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": proc.stderr.strip().splitlines()[-1:]}
    return json.loads(lines[-1])


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run of median wall seconds to the first token (the first failed
    one if any failed), with every run under ``runs``."""
    failed = [r for r in runs if "error" in r]
    if failed:
        return failed[0]
    ordered = sorted(runs, key=lambda r: r["first_token_seconds"])
    out = dict(ordered[(len(ordered) - 1) // 2])
    if len(runs) > 1:
        out["runs"] = runs
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--trees", nargs="+", default=None, help="NAME=PYTHONPATH of pagedrs trees")
    ap.add_argument("--engines", nargs="+", default=["pagedrs", "llama.cpp"])
    ap.add_argument("--repeat", type=int, default=1, help="runs of every load; medians reported")
    ap.add_argument("--json", action="store_true", help="print one JSON object last")
    ap.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(*args.worker)))
        return
    trees = [t.split("=", 1) for t in args.trees] if args.trees else [["pagedrs", None]]
    results: dict[str, Any] = {}
    rows = []
    gb = 1e9
    for key in args.models:
        path = GGUF_DIR / MODELS[key].file
        if not path.exists():
            print(f"{path} missing, skipped", file=sys.stderr)
            continue
        entry: dict[str, Any] = {"file": path.name, "file_bytes": path.stat().st_size}
        with open(path, "rb") as f:  # into the page cache for every run
            while f.read(1 << 24):
                pass
        runs = [(name, "pagedrs", tree) for name, tree in trees if "pagedrs" in args.engines]
        if "llama.cpp" in args.engines:
            runs.append(("llama.cpp", "llama.cpp", None))
        measured: dict[str, list[dict[str, Any]]] = {}
        for _ in range(args.repeat):
            for name, engine, tree in runs:
                if engine == "pagedrs":
                    clear_metadata_cache(path, tree)
                for load in ("first", "second"):
                    measured.setdefault(f"{name}.{load}", []).append(run_worker(engine, path, tree))
        for name, _engine, _tree in runs:
            for load in ("first", "second"):
                res = median_run(measured[f"{name}.{load}"])
                entry[f"{name}.{load}"] = res
                if "error" in res:
                    rows.append([MODELS[key].label, name, load, "error", res["error"], "", "", ""])
                    continue
                rows.append(
                    [
                        MODELS[key].label,
                        name,
                        load,
                        f"{res['seconds']:.2f}",
                        f"{res['first_token_seconds']:.2f}",
                        f"{res['cpu_seconds']:.2f}",
                        f"{res['first_token_cpu_seconds']:.2f}",
                        f"{res['after_load']['VmHWM'] / gb:.2f}",
                    ]
                )
                print(" | ".join(rows[-1]), file=sys.stderr)
        results[key] = entry
    print_table(
        f"GGUF load ({cpu_name()}, loadavg {os.getloadavg()[0]:.1f})",
        [
            "model",
            "engine",
            "load",
            "load s",
            "first token s",
            "load CPU s",
            "first token CPU s",
            "peak RSS GB",
        ],
        rows,
    )
    if args.json:
        out = {
            "cpu": cpu_name(),
            "repeat": args.repeat,
            "loadavg_end": os.getloadavg(),
            "models": results,
        }
        print(json.dumps(json_safe(out)))


if __name__ == "__main__":
    main()
