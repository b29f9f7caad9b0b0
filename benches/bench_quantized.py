"""Quantized GGUF models, pagedrs against llama.cpp on the same file: output
tokens/s at 1, 16, 64 (and 256) sequences, prefill tokens/s of one long prompt,
and the peak resident memory of each engine.

Per model, each engine runs in its own subprocess (``--worker``), one after the
other in the same run, with the same prompts (token ids), greedy decoding, a
fixed output length per request (EOS ignored) and the same thread count
(``torch.get_num_threads()``, llama.cpp ``n_threads`` / ``n_threads_batch``):

- ``seqs N``: N requests of ``--prompt-tokens`` (16) tokens each (windows of the
  Alpaca-like instructions of ../shared/data, tokenized by llama.cpp's vocabulary
  of the file) submitted at once, ``--output-tokens`` each; output tokens / wall
  seconds from submission to the last output (prompt processing included);
- ``prefill``: one prompt of ``--prefill-tokens`` (2,048) tokens (the Alpaca
  replies, concatenated), one output token; prompt tokens / wall seconds.

Beside each wall time, the worker's CPU seconds (user + system, all threads) over
the same window. llama.cpp loads the model and makes a context for every batch
(``run_batched``); its window, wall and CPU, starts after that, at the first
``llama_decode``.

pagedrs: ``LLM(model=FILE, activation_quantization=--activations)`` (weights
kept in their GGUF blocks, KV cache in the model dtype), ``max_num_seqs`` the
largest batch, a KV budget of the run's largest need (reported as
``kv_bytes``). llama.cpp: ``benches/llama_cpp_peer.py``
(its batch API, continuous batching, f16 KV cache, one unified KV pool of the
batch's tokens, ``n_batch`` 2048, micro-batches of 512), the file memory-mapped.

Memory, per worker process: ``VmHWM`` (peak resident set, file-backed pages of
the mapped GGUF included) after load, after each batch (``decode.N.vmhwm``: the
peak up to and including that batch) and at the end, and the end's ``RssAnon`` /
``RssFile`` split, from ``/proc/self/status``; ``before_load``: the same before the
model is loaded (pagedrs: torch, transformers and pagedrs imported). The bound of
issue 30 for pagedrs is 1.25 x file size + 1 GiB + KV bytes.

    python benches/bench_quantized.py [--models smollm2 gemma3 1b 8b]
        [--activations auto|int16|int8] [--json]

Models (``MODELS``): the default SmolLM2-135M Q4_1 and Gemma 3 270M Q4_K_M under
``~/.cache/pagedrs/gguf``; the 1B and 8B Llama-shaped random-weight Q4_0 files
written by ``benches/make_gguf.py`` (made on first use); ``qwen3moe``: the
mixture-of-experts slice of ``bench_gguf_archs.SPEED_CASES`` (made on first
use); ``30b-a3b``: the Qwen3-30B-A3B-shaped Q4_K_M file of
``benches/make_moe_gguf.py`` (~18.7 GB; made on first use). The 8B model runs
1, 16, 64 and 256 sequences, the 30B-A3B 1, 16 and 64, both with
``--big-prompt-tokens`` (4) prompts, ``--big-output-tokens`` (4) outputs and no
prefill; ``--batches`` splits that
into shorter runs (``--batches 1 16 64``, then ``--batches 256``), and
``--batches --prefill on`` runs the prefill alone.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import json_safe, print_table, read_data

HERE = Path(__file__).resolve().parent
GGUF_DIR = Path.home() / ".cache" / "pagedrs" / "gguf"


@dataclass(frozen=True)
class ModelSpec:
    """A benchmarked file: path (or a make_gguf shape), batch sizes, prefill."""

    label: str
    file: str
    batches: tuple[int, ...]
    prefill: bool
    big: bool = False  # the 8B shape: short outputs


MODELS = {
    "smollm2": ModelSpec(
        "SmolLM2-135M Q4_1", "SmolLM2-135M-Instruct.Q4_1.gguf", (1, 16, 64, 256), True
    ),
    "gemma3": ModelSpec("Gemma 3 270M Q4_K_M", "gemma-3-270m-q4_k_m.gguf", (1, 16, 64, 256), True),
    "1b": ModelSpec("Llama-3.2-1B-shaped Q4_0", "llama-1b-random.Q4_0.gguf", (1, 16, 64), True),
    "8b": ModelSpec(
        "Llama-3.1-8B-shaped Q4_0", "llama-8b-random.Q4_0.gguf", (1, 16, 64, 256), False, big=True
    ),
    "qwen3moe": ModelSpec(
        "Qwen3-30B-A3B slice Q4_K (32 experts, 8 active, 4 layers)",
        "archs/qwen3moe-slice-random.Q4_K.gguf",
        (1, 16, 64),
        False,
    ),
    "30b-a3b": ModelSpec(
        "Qwen3-30B-A3B-shaped Q4_K_M (128 experts, 8 active, 48 layers)",
        "qwen3moe-30b-a3b-random.Q4_K_M.gguf",
        (1, 16, 64),
        False,
        big=True,
    ),
}


def proc_status() -> dict[str, int]:
    """VmHWM, VmRSS, RssAnon, RssFile of this process, bytes."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
            out[key] = int(rest.split()[0]) * 1024
    return out


def cpu_seconds() -> float:
    """User + system CPU seconds of this process so far (all its threads)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def cpu_name() -> str:
    """The CPU's model name, family and model from /proc/cpuinfo, and its vector ISA."""
    info: dict[str, str] = {}
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        key, _, value = line.partition(":")
        info.setdefault(key.strip(), value.strip())
    flags = info.get("flags", "").split()
    isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    name = info.get("model name", platform.processor())
    return f"{name} (family {info.get('cpu family')} model {info.get('model')}, {isa})"


def _vocabulary(path: Path) -> tuple[Callable[[str], list[int]], dict[str, Any]]:
    """(text -> token ids without BOS, the file's metadata): llama.cpp's
    vocabulary of ``path``, or without llama-cpp-python transformers' tokenizer
    of the file (runs of pagedrs alone)."""
    try:
        import llama_cpp
    except ImportError:
        from pagedrs.executor.quant.gguf_header import read_header
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        metadata = read_header(path).metadata

        def tokenize(text: str) -> list[int]:
            return list(tok(text, add_special_tokens=False).input_ids)

        return tokenize, metadata
    vocab = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)

    def tokenize_llama_cpp(text: str) -> list[int]:
        return list(vocab.tokenize(text.encode(), add_bos=False, special=False))

    return tokenize_llama_cpp, dict(vocab.metadata)


def make_prompts(path: Path, n: int, length: int, prefill: int) -> dict[str, Any]:
    """``n`` prompts of ``length`` token ids and one of ``prefill`` token ids, from
    the Alpaca-like data, tokenized by the file's vocabulary (``_vocabulary``)."""
    tokenize, metadata = _vocabulary(path)
    records = read_data("alpaca_en_demo.json")
    ids: list[int] = []
    for r in records:
        ids += tokenize(r["instruction"])
        if len(ids) >= n * length:
            break
    long: list[int] = []
    for r in records:
        long += tokenize(r["output"] + "\n")
        if len(long) >= prefill:
            break
    return {
        "short": [ids[i * length : (i + 1) * length] for i in range(n)],
        "long": long[:prefill],
        "kv_bytes_per_token": _kv_bytes_per_token(metadata),
    }


def _kv_bytes_per_token(meta: dict[str, Any]) -> int:
    """K and V bytes of one token over all layers, float32 (pagedrs' GGUF dtype),
    from the file's metadata (llama.cpp's strings or the header's values)."""
    arch = meta["general.architecture"]

    def get(key: str) -> int:
        return int(meta[f"{arch}.{key}"])

    heads = get("attention.head_count")
    key_len = f"{arch}.attention.key_length"
    head_dim = int(meta[key_len]) if key_len in meta else get("embedding_length") // heads
    return 2 * get("block_count") * get("attention.head_count_kv") * head_dim * 4


#: An engine's run: (prompts, output tokens) -> (wall seconds, CPU seconds of the
#: same window, each prompt's output token ids).
Run = Callable[[list[list[int]], int], tuple[float, float, list[list[int]]]]


def measure(run: Run, job: dict[str, Any], res: dict[str, Any]) -> dict[str, Any]:
    """Time ``run`` on the job's batches and its long prompt, wall and CPU
    seconds, into ``res``; after each batch the process's ``VmHWM`` so far
    (its peak resident set up to and including that batch)."""
    out_len = job["output_tokens"]
    res.setdefault("decode", {})
    for n in job["batches"]:
        dt, cpu, outs = run(job["short"][:n], out_len)
        res["decode"][str(n)] = {
            "seconds": dt,
            "cpu_seconds": cpu,
            "tok_s": n * out_len / dt,
            "vmhwm": proc_status()["VmHWM"],
            "first": outs[0],
        }
    if job["long"]:
        dt, cpu, _ = run([job["long"]], 1)
        res["prefill"] = {
            "tokens": len(job["long"]),
            "seconds": dt,
            "cpu_seconds": cpu,
            "tok_s": len(job["long"]) / dt,
        }
    res["end"] = proc_status()
    return res


def worker_pagedrs(args: argparse.Namespace, job: dict[str, Any]) -> dict[str, Any]:
    """Load the file in pagedrs and run the job's batches and prefill."""
    import torch
    from pagedrs import LLM, SamplingParams

    path = Path(job["path"])
    longest = max(job["batches"], default=1)
    out_len = job["output_tokens"]
    need = max(longest * (job["prompt_tokens"] + out_len), len(job["long"]) + 1 + 16)
    kv_bytes = int(need * 1.1 + 16 * 64) * job["kv_bytes_per_token"]
    torch.set_num_threads(job["threads"])
    before = proc_status()  # torch, transformers and pagedrs imported
    t0 = time.perf_counter()
    llm = LLM(
        model=str(path),
        max_model_len=max(len(job["long"]), job["prompt_tokens"]) + out_len + 16,
        max_num_seqs=longest,
        kv_cache_memory_bytes=kv_bytes,
        activation_quantization=job["activations"],
    )
    res: dict[str, Any] = {
        "engine": "pagedrs",
        "activation_quantization": job["activations"],
        "threads": torch.get_num_threads(),
        "load_s": time.perf_counter() - t0,
        "kv_bytes": kv_bytes,
        "before_load": before,
        "after_load": proc_status(),
    }

    def run(prompts: list[list[int]], n_out: int) -> tuple[float, float, list[list[int]]]:
        params = SamplingParams(temperature=0.0, max_tokens=n_out, ignore_eos=True)
        c, t = cpu_seconds(), time.perf_counter()
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        dt, cpu = time.perf_counter() - t, cpu_seconds() - c
        return dt, cpu, [list(o.outputs[0].token_ids) for o in outs]

    run(job["short"][:1], 2)  # warm-up
    return measure(run, job, res)


def worker_llama_cpp(args: argparse.Namespace, job: dict[str, Any]) -> dict[str, Any]:
    """Run the job's batches and prefill with llama.cpp on the file."""
    import llama_cpp_peer

    path = Path(job["path"])
    threads = job["threads"]
    res: dict[str, Any] = {"engine": "llama.cpp", "threads": threads}
    res["before_load"] = proc_status()

    def run(prompts: list[list[int]], n_out: int) -> tuple[float, float, list[list[int]]]:
        # each call loads the model and makes a context; wall and CPU seconds
        # cover the decode loop only (``run_batched``'s window)
        reqs: list[llama_cpp_peer.Request] = [(p, n_out) for p in prompts]
        stats: dict[str, float] = {}
        dt, outs = llama_cpp_peer.run_batched(
            path, reqs, n_out, threads, parallel=len(prompts), unified=True, stats=stats
        )
        return dt, stats["cpu_seconds"], outs

    t0 = time.perf_counter()
    run(job["short"][:1], 2)  # load (the file mapped) and warm-up
    res["load_s"] = time.perf_counter() - t0
    res["after_load"] = proc_status()
    return measure(run, job, res)


def run_worker(engine: str, job: dict[str, Any], timeout: float) -> dict[str, Any]:
    """One engine on one model in a fresh subprocess; its result (or the error)."""
    env = dict(os.environ)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", engine]
    try:
        proc = subprocess.run(
            cmd, input=json.dumps(job), capture_output=True, text=True, env=env, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return {"engine": engine, "error": f"timed out after {timeout:.0f} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"engine": engine, "error": proc.stderr.strip().splitlines()[-1:]}
    return json.loads(lines[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["smollm2", "gemma3", "1b"], choices=MODELS)
    ap.add_argument("--prompt-tokens", type=int, default=16)
    ap.add_argument("--output-tokens", type=int, default=16)
    ap.add_argument("--big-output-tokens", type=int, default=4, help="outputs of the 8B shape")
    ap.add_argument("--big-prompt-tokens", type=int, default=4, help="prompts of the 8B shape")
    ap.add_argument("--prefill-tokens", type=int, default=2048)
    ap.add_argument(
        "--prefill",
        choices=["auto", "on", "off"],
        default="auto",
        help="the long prompt: auto = every model's default (none at 8B)",
    )
    ap.add_argument(
        "--batches",
        type=int,
        nargs="*",
        default=None,
        help="override every model's (none: no decode)",
    )
    ap.add_argument("--engines", nargs="+", default=["pagedrs", "llama.cpp"])
    ap.add_argument(
        "--activations",
        default="auto",
        choices=["auto", "int16", "int8"],
        help="pagedrs' activation_quantization",
    )
    ap.add_argument("--threads", type=int, default=None, help="default: torch's")
    ap.add_argument("--save", type=Path, default=None, help="write the JSON after each model")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per worker")
    ap.add_argument("--json", action="store_true", help="print one JSON object last")
    ap.add_argument("--show", type=Path, nargs="+", help="print the table of saved JSON runs")
    ap.add_argument("--worker", choices=["pagedrs", "llama.cpp"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.show:
        for path in args.show:
            print_results(json.loads(path.read_text().strip().splitlines()[-1]))
        return
    if args.worker:
        job = json.loads(sys.stdin.read())
        fn = worker_pagedrs if args.worker == "pagedrs" else worker_llama_cpp
        print(json.dumps(json_safe(fn(args, job))))
        return

    import torch

    sys.path.insert(0, str(HERE))
    import make_gguf

    threads = args.threads or torch.get_num_threads()
    results: dict[str, Any] = {}
    for key in args.models:
        spec = MODELS[key]
        path = GGUF_DIR / spec.file
        if key in ("1b", "8b"):
            path = make_gguf.ensure(key)
        if key == "qwen3moe":
            import bench_gguf_archs

            path = bench_gguf_archs.write_case("qwen3moe-slice")
        if key == "30b-a3b":
            import make_moe_gguf

            path = make_moe_gguf.ensure()
        if not path.exists():
            print(f"{spec.label}: {path} missing, skipped")
            continue
        batches = tuple(args.batches) if args.batches is not None else spec.batches
        prompt_tokens = args.big_prompt_tokens if spec.big else args.prompt_tokens
        prefill = {"auto": spec.prefill, "on": True, "off": False}[args.prefill]
        prompts = make_prompts(
            path, max(batches, default=1), prompt_tokens, args.prefill_tokens if prefill else 0
        )
        job = {
            "path": str(path),
            "batches": list(batches),
            "prompt_tokens": prompt_tokens,
            "output_tokens": args.big_output_tokens if spec.big else args.output_tokens,
            "threads": threads,
            "activations": args.activations,
            **prompts,
        }
        entry: dict[str, Any] = {
            "label": spec.label,
            "file_bytes": path.stat().st_size,
            "output_tokens": job["output_tokens"],
            "prompt_tokens": prompt_tokens,
        }
        for engine in args.engines:
            t0 = time.perf_counter()
            entry[engine] = run_worker(engine, job, args.timeout)
            print(f"{spec.label} {engine}: {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        results[key] = entry
        if args.save:
            args.save.write_text(json.dumps(json_safe(summary(args, threads, results))) + "\n")
    print_results(summary(args, threads, results))
    if args.json:
        print(json.dumps(json_safe(summary(args, threads, results))))


def _rates(run: dict[str, Any], tokens: int) -> tuple[float | None, float | None]:
    """(tokens per wall second, tokens per CPU second) of one measured run."""
    if not run:
        return None, None
    return run["tok_s"], tokens / run["cpu_seconds"] if run.get("cpu_seconds") else None


def print_results(res: dict[str, Any]) -> None:
    """The table of a run's JSON object (``summary``): per model and measure,
    tokens per wall second and per CPU second of each engine, and the ratios."""
    rows = []
    gib = 1 << 30
    for e in res["models"].values():
        p, c = e.get("pagedrs", {}), e.get("llama.cpp", {})
        for engine in ("pagedrs", "llama.cpp"):
            if "error" in e.get(engine, {}):
                print(f"{e['label']} {engine} failed: {e[engine]['error']}")
        out = e.get("output_tokens", res["output_tokens"])
        ns = sorted({*p.get("decode", {}), *c.get("decode", {})}, key=int)
        measures = [(f"{n} seqs", "decode", n, int(n) * out) for n in ns]
        if "prefill" in p or "prefill" in c:
            measures.append((f"prefill {res['prefill_tokens']}", "prefill", None, 0))
        for label, kind, n, tokens in measures:
            pr = p.get(kind, {}) if n is None else p.get(kind, {}).get(n, {})
            cr = c.get(kind, {}) if n is None else c.get(kind, {}).get(n, {})
            if n is None:
                tokens = (pr or cr).get("tokens", res["prefill_tokens"])
            (pa, pc), (ca, cc) = _rates(pr, tokens), _rates(cr, tokens)
            row = [e["label"], label, _f(pa), _f(ca), _ratio(pa, ca)]
            rows.append(row + [_f(pc), _f(cc), _ratio(pc, cc)])
        for n in ns:  # VmHWM through each batch (runs that record it)
            ph, ch = (x.get("decode", {}).get(n, {}).get("vmhwm") for x in (p, c))
            if ph or ch:
                gib_p, gib_c = (h and h / (1 << 30) for h in (ph, ch))
                rows.append([e["label"], f"peak RSS GiB to {n} seqs", _f(gib_p), _f(gib_c)])
                rows[-1] += [_ratio(ph, ch), "", "", ""]
        pk, ck = p.get("end", {}).get("VmHWM"), c.get("end", {}).get("VmHWM")
        bound = 1.25 * e["file_bytes"] + gib + p.get("kv_bytes", 0)
        e["pagedrs_rss_bound"] = bound
        base = p.get("before_load", {}).get("VmRSS")
        rows.append(
            [
                e["label"],
                f"peak RSS GiB (bound {bound / gib:.2f})",
                _f(pk and pk / gib),
                _f(ck and ck / gib),
                _ratio(pk, ck),
                f"({_f(base and base / gib)} before load)",
                "",
                "",
            ]
        )
    print_table(
        f"GGUF models, pagedrs vs llama.cpp, greedy, {res['threads']} thread(s), {res['cpu']};"
        " decode: output tokens, prefill: prompt tokens, per wall second and per CPU second",
        [
            "model",
            "measure",
            "pagedrs/s",
            "llama.cpp/s",
            "ratio",
            "pagedrs/cpu-s",
            "llama.cpp/cpu-s",
            "ratio cpu",
        ],
        rows,
    )


def summary(args: argparse.Namespace, threads: int, results: dict[str, Any]) -> dict[str, Any]:
    """The run's JSON object."""
    return {
        "cpu": cpu_name(),
        "threads": threads,
        "activation_quantization": args.activations,
        "loadavg_end": os.getloadavg(),
        "prompt_tokens": args.prompt_tokens,
        "output_tokens": args.output_tokens,
        "big_output_tokens": args.big_output_tokens,
        "prefill_tokens": args.prefill_tokens,
        "big_prompt_tokens": args.big_prompt_tokens,
        "models": results,
    }


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if not a or not b else f"{a / b:.2f}x"


if __name__ == "__main__":
    main()
