"""``pagedrs serve`` against llama.cpp's own ``llama-server`` on the same GGUF
file and the same cores, measured by vLLM's benchmark client.

Each engine serves the file on a loopback port, pinned to ``--cpus`` with
``--threads`` threads (pagedrs: ``OMP_NUM_THREADS`` and ``--torch-threads``;
llama-server: ``-t`` / ``-tb``, ``--parallel`` slots as many as the point's
prompts, ``-c`` = slots x (input + output tokens), ``--cont-batching``). For each
point, ``vllm bench serve --backend openai --endpoint /v1/completions
--dataset-name random --ignore-eos --seed 0`` (random prompts of
``--input-len`` tokens of the file's tokenizer, ``--output-len`` output tokens)
runs pinned to ``--client-cpus``; its saved result gives TPOT p50/p90, TTFT,
output tokens/s and each request's input and output token counts (from the
servers' ``usage``).

Per engine: first all ``--saturation-prompts`` prompts at once (rate inf: the
saturated output tokens/s and requests/s), then Poisson arrivals at each of
``--rates`` in rising order, stopping after the first rate whose TPOT p90 is at
or over ``--tpot-bound-ms``. A rate's prompt count is ``rate x --span-s``
(at least ``--min-prompts``), the same for both engines, so both see the same
prompts (same seed, tokenizer and count). An engine's answer is the highest rate
at which it and every lower measured rate keep TPOT p90 under the bound, no
request fails and every request returns ``--output-len`` tokens
(``highest_rate_under``).

The client's tokenizer is pagedrs' tokenizer of the GGUF file (its metadata
written out as a transformers tokenizer folder). With ``--lock`` each point (the
server's start, its load, the run) holds an exclusive ``flock`` of that file;
the client starts before the lock is taken and waits for the server. Before
each point the benchmark waits up to ``--quiet-timeout-s`` for ``--cpus`` to be
busy less than ``--quiet-limit`` of the time, and each point records the
server's share of those CPUs' busy seconds (``server_cpu_share``: 1.0 when the
server had them alone).

    python benches/bench_serving_peers.py --llama-server /path/to/llama-server \\
        [--model FILE.gguf] [--engines pagedrs llama.cpp] [--rates 0.05 0.1 ...] \\
        [--cpus 1] [--client-cpus 0] [--threads 1] [--lock /path/cpu1.lock] \\
        [--save RESULT.json] [--json]
    python benches/bench_serving_peers.py --engines --reuse A.json B.json \
        [--reread llama.cpp=WORKDIR] --save RESULT.json

The second form runs nothing: it joins the saved results of separate runs (one
engine's points merged by rate) and, with ``--reread``, reads an engine's points
again from the client results and server logs kept in that run's
``--workdir``. llama-server's output token counts come from its log, since
vLLM's client does not read llama-server's streamed ``usage``
(``parse_vllm_result``).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import math
import os
import re
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import date
from pathlib import Path
from typing import Any

from common import cpu_name, json_safe, print_table

DEFAULT_MODEL = Path.home() / ".cache" / "pagedrs" / "gguf" / "llama-1b-random.Q4_0.gguf"
DEFAULT_VLLM = "/work/vllm-venv/bin/vllm"
SERVED_NAME = "bench-model"
ENGINES = ("pagedrs", "llama.cpp")


def parse_vllm_result(
    result: dict[str, Any], output_lens: list[int] | None = None
) -> dict[str, Any]:
    """The figures of one ``vllm bench serve --save-result --save-detailed`` JSON
    object (``--percentile-metrics ttft,tpot,itl --metric-percentiles 50,90``).

    ``output_lens``: each successful request's output token count as the server
    reported it, when the client's count (``output_lens`` of the result) is not
    the server's: vLLM's client reads ``usage`` only from a streamed chunk
    without ``choices``, and llama-server sends its usage in the chunk with the
    last ``choices``, so for llama-server the client re-tokenizes the text. TPOT
    is then recomputed per request as vLLM does, (latency - TTFT) / (output
    tokens - 1), from the result's ``latencies`` and ``ttfts``, with p50 / p90 as
    ``numpy.percentile``, and output tokens/s as their sum over the duration.

    Returns request_rate (req/s, ``inf`` for all at once), num_prompts, completed,
    failed, duration_s, request_throughput (req/s), output_throughput (tokens/s),
    ttft/tpot/itl p50 and p90 and tpot_mean (ms), the min / max of the requests'
    input and output token counts, output_lens_source (``client`` or
    ``server``) and, when recomputed, the client's own client_tpot_p90_ms and
    client_output_len_min / _max.

    Raises:
        KeyError: a field of those flags is missing.
        ValueError: ``output_lens`` does not have one count per completed request.
    """
    import numpy as np

    rate = result["request_rate"]
    out: dict[str, Any] = {
        "request_rate": math.inf if rate == "inf" else float(rate),
        "num_prompts": int(result["num_prompts"]),
        "completed": int(result["completed"]),
        "failed": int(result.get("failed", 0)),
        "duration_s": float(result["duration"]),
        "request_throughput": float(result["request_throughput"]),
        "output_throughput": float(result["output_throughput"]),
        "tpot_mean_ms": float(result["mean_tpot_ms"]),
    }
    for metric in ("ttft", "tpot", "itl"):
        for q in ("p50", "p90"):
            out[f"{metric}_{q}_ms"] = float(result[f"{q}_{metric}_ms"])
    for key in ("input_lens", "output_lens"):
        lens = [int(n) for n in result[key] if n]
        out[f"{key[:-1]}_min"] = min(lens) if lens else 0
        out[f"{key[:-1]}_max"] = max(lens) if lens else 0
    out["output_lens_source"] = "client"
    if output_lens is not None:
        ok = [not e for e in result["errors"]]
        if len(output_lens) != sum(ok):
            raise ValueError(f"{len(output_lens)} output counts for {sum(ok)} completed requests")
        out["client_tpot_p90_ms"] = out["tpot_p90_ms"]
        out["client_output_len_min"] = out["output_len_min"]
        out["client_output_len_max"] = out["output_len_max"]
        spans = [
            (lat - ttft)
            for lat, ttft, good in zip(result["latencies"], result["ttfts"], ok, strict=True)
            if good
        ]
        tpot = np.array([sp / (n - 1) for sp, n in zip(spans, output_lens, strict=True) if n > 1])
        out["tpot_mean_ms"] = float(tpot.mean() * 1e3) if len(tpot) else math.nan
        for q in (50, 90):
            out[f"tpot_p{q}_ms"] = float(np.percentile(tpot, q) * 1e3) if len(tpot) else math.nan
        out["output_throughput"] = sum(output_lens) / out["duration_s"]
        out["output_len_min"] = min(output_lens, default=0)
        out["output_len_max"] = max(output_lens, default=0)
        out["output_lens_source"] = "server"
    return out


#: llama-server's per-request timing lines: "prompt eval time = ... / N tokens"
#: and "eval time = ... / N tokens".
_LLAMA_TIMING = re.compile(r"\|\s+(prompt eval|eval) time =\s+[\d.]+ ms /\s+(\d+) tokens")


def llama_server_counts(log: str) -> tuple[list[int], list[int]]:
    """(prompt tokens evaluated, tokens generated) of each request llama-server
    finished, in its log's order, from its ``print_timing`` lines."""
    prompt, generated = [], []
    for kind, n in _LLAMA_TIMING.findall(log):
        (prompt if kind == "prompt eval" else generated).append(int(n))
    return prompt, generated


def point_ok(point: dict[str, Any], output_len: int, bound_ms: float) -> bool:
    """Whether a rate point is under the TPOT p90 bound (ms) with every request
    completed and returning ``output_len`` tokens."""
    return (
        point["failed"] == 0
        and point["completed"] == point["num_prompts"]
        and point["output_len_min"] == point["output_len_max"] == output_len
        and point["tpot_p90_ms"] < bound_ms
    )


def highest_rate_under(points: list[dict[str, Any]], output_len: int, bound_ms: float) -> float:
    """The highest finite request rate (req/s) such that it and every lower
    measured finite rate pass ``point_ok``; 0.0 when the lowest rate fails or
    none was measured."""
    best = 0.0
    for p in sorted((p for p in points if math.isfinite(p["request_rate"])), key=rate_key):
        if not point_ok(p, output_len, bound_ms):
            break
        best = p["request_rate"]
    return best


def rate_key(point: dict[str, Any]) -> float:
    """Sort key of a point: its request rate."""
    return float(point["request_rate"])


def prompts_for_rate(rate: float, span_s: float, min_prompts: int, max_prompts: int) -> int:
    """The prompt count of a rate point: ``rate x span_s`` requests (about
    ``span_s`` seconds of arrivals), within [min_prompts, max_prompts]."""
    return max(min_prompts, min(max_prompts, round(rate * span_s)))


def cpu_family_model() -> str:
    """``family F model M`` of the CPU (``/proc/cpuinfo``), empty when unknown."""
    fields: dict[str, str] = {}
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    if "cpu family" in fields and "model" in fields:
        return f"family {fields['cpu family']} model {fields['model']}"
    return ""


def cpus_of(cpus: str) -> set[int]:
    """The CPU numbers of a ``taskset`` list (``1``, ``0-3``, ``1,3``)."""
    out: set[int] = set()
    for part in cpus.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def cpu_busy_s(cpus: str) -> float:
    """Busy seconds (all but idle and iowait) of the CPUs in list ``cpus``
    (``taskset`` syntax: ``1``, ``0-3``, ``1,3``) since boot, from ``/proc/stat``."""
    wanted = cpus_of(cpus)
    tick = os.sysconf("SC_CLK_TCK")
    busy = 0
    with open("/proc/stat") as f:
        for line in f:
            name, *values = line.split()
            if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in wanted:
                v = [int(x) for x in values]
                busy += sum(v) - v[3] - v[4]
    return busy / tick


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` and its living
    descendants, from ``/proc``; 0 for processes gone."""
    tick = os.sysconf("SC_CLK_TCK")
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        with contextlib.suppress(OSError):
            stat = Path(f"/proc/{p}/stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            total += (int(fields[11]) + int(fields[12])) / tick
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
    return total


def free_port() -> int:
    """A free TCP port on the loopback interface."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_tokenizer(model: Path, folder: Path) -> Path:
    """pagedrs' transformers tokenizer of GGUF ``model`` saved in ``folder``
    (``tokenizer.json``, ``tokenizer_config.json``); returns ``folder``."""
    from pagedrs.executor.gguf_tokenizer import gguf_tokenizer

    gguf_tokenizer(model).save_pretrained(folder)
    return folder


def server_command(
    engine: str,
    model: Path,
    port: int,
    threads: int,
    slots: int,
    context_per_slot: int,
    llama_server: Path | None,
) -> list[str]:
    """The command line of one engine's server (not yet pinned).

    Raises:
        ValueError: an unknown engine, or llama.cpp without ``llama_server``.
    """
    if engine == "pagedrs":
        return [
            sys.executable, "-m", "pagedrs.cli", "serve", str(model), "--port", str(port),
            "--served-model-name", SERVED_NAME, "--max-model-len", str(context_per_slot),
            "--torch-threads", str(threads), "--log-level", "warning",
            "--max-waiting-requests", "100000",
        ]  # fmt: skip
    if engine == "llama.cpp":
        if llama_server is None:
            raise ValueError("llama.cpp needs --llama-server PATH")
        return [
            str(llama_server), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
            "--alias", SERVED_NAME, "-t", str(threads), "-tb", str(threads),
            "--parallel", str(slots), "-c", str(slots * context_per_slot), "--cont-batching",
            "-ngl", "0", "--no-webui",
        ]  # fmt: skip
    raise ValueError(f"unknown engine {engine!r}: one of {ENGINES}")


def client_command(
    vllm: str, port: int, tokenizer: Path, args: argparse.Namespace, rate: float, n: int, out: Path
) -> list[str]:
    """``vllm bench serve`` of one point, its result saved to ``out``."""
    return [
        vllm, "bench", "serve", "--backend", "openai", "--base-url", f"http://127.0.0.1:{port}",
        "--endpoint", "/v1/completions", "--model", SERVED_NAME, "--tokenizer", str(tokenizer),
        "--dataset-name", "random", "--random-input-len", str(args.input_len),
        "--random-output-len", str(args.output_len), "--ignore-eos",
        "--request-rate", "inf" if math.isinf(rate) else f"{rate:g}", "--num-prompts", str(n),
        "--seed", "0", "--percentile-metrics", "ttft,tpot,itl", "--metric-percentiles", "50,90",
        "--save-result", "--save-detailed", "--result-dir", str(out.parent),
        "--result-filename", out.name, "--ready-check-timeout-sec", "3600", "--disable-tqdm",
    ]  # fmt: skip


@contextlib.contextmanager
def held(lock: Path | None) -> Iterator[float]:
    """An exclusive ``flock`` of ``lock`` (none when None); yields the seconds
    waited for it."""
    if lock is None:
        yield 0.0
        return
    t0 = time.monotonic()
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield time.monotonic() - t0
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def descendants(pid: int) -> list[int]:
    """The living descendants of process ``pid`` (``/proc``)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{p}/task").iterdir():
                children = [int(c) for c in (task / "children").read_text().split()]
                out += children
                todo += children
    return out


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Terminate a started process and wait for it (kill after 30 s), then kill
    whichever of its descendants outlived it."""
    left = descendants(proc.pid)
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)


def wait_quiet(cpus: str, limit: float, timeout_s: float, lock: Path | None) -> float:
    """Wait (up to ``timeout_s``) until the CPUs ``cpus`` are busy under ``limit``
    of 3 s, sampled under ``lock`` and retried every 20 s without it; returns the
    busy fraction last sampled. The lock is not held on return."""
    deadline = time.monotonic() + timeout_s
    n = len(cpus_of(cpus))
    while True:
        with held(lock):
            b0 = cpu_busy_s(cpus)
            time.sleep(3.0)
            frac = (cpu_busy_s(cpus) - b0) / (3.0 * n)
        if frac < limit or time.monotonic() > deadline:
            return frac
        print(f"CPUs {cpus} {frac:.0%} busy with other work: waiting", flush=True)
        time.sleep(20.0)


def point_tag(engine: str, rate: float, n: int) -> str:
    """The file name stem of a point's client result and logs in the workdir."""
    return f"{engine.replace('.', '')}_{'inf' if math.isinf(rate) else f'{rate:g}'}_{n}"


def reread(row: dict[str, Any], engine: str, workdir: Path, output_len: int, bound: float) -> None:
    """Re-read a saved engine row's points (``read_point``) from the client
    results and server logs kept in ``workdir`` (those whose files it holds),
    keeping the per-point CPU and lock figures of the row."""
    for key in ("saturation", "points"):
        if key not in row:
            continue
        olds = [row[key]] if key == "saturation" else row[key]
        news = []
        for old in olds:
            rate = float(old["request_rate"])
            tag = point_tag(engine, rate, int(old["num_prompts"]))
            if not (workdir / f"{tag}.json").exists():  # a point of another run
                news.append(old)
                continue
            new = read_point(engine, workdir / f"{tag}.json", workdir / f"{tag}.server.log")
            news.append({**old, **new})
        row[key] = news[0] if key == "saturation" else news
    row["highest_rate_under_bound"] = highest_rate_under(row["points"], output_len, bound)


def read_point(engine: str, result: Path, server_log: Path) -> dict[str, Any]:
    """``parse_vllm_result`` of a point's saved client result; for llama.cpp with
    the output counts of its server log (``llama_server_counts``; the log's
    first request, vLLM's ready check, left out: it comes before the run's)."""
    data = json.loads(result.read_text())
    if engine != "llama.cpp":
        return parse_vllm_result(data)
    _, generated = llama_server_counts(server_log.read_text(errors="replace"))
    completed = sum(not e for e in data["errors"])
    return parse_vllm_result(data, generated[len(generated) - completed :])


def run_point(
    engine: str, rate: float, n: int, tokenizer: Path, workdir: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """One engine's server at one rate: the client started first (it waits for
    the server), then under the lock the server started, the client's run, the
    server stopped. Returns ``parse_vllm_result``'s figures plus
    cpus_busy_before (the busy fraction of ``--cpus`` before the point,
    ``wait_quiet``), lock_wait_s (seconds waited for the lock), held_s (seconds
    from the server's start to the client's end), server_cpu_s (the server's CPU
    seconds, its processes together, sampled every 0.5 s), cpus_busy_s (busy
    seconds of ``--cpus`` over held_s, every process's) and server_cpu_share
    (their ratio: 1.0 when nothing else ran on those CPUs).

    Raises:
        RuntimeError: the client failed or the server exited early.
    """
    port = free_port()
    tag = point_tag(engine, rate, n)
    out = workdir / f"{tag}.json"
    context = args.input_len + args.output_len + args.context_margin
    server = server_command(engine, args.model, port, args.threads, n, context, args.llama_server)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    client_log = open(workdir / f"{tag}.client.log", "wb")
    server_log = open(workdir / f"{tag}.server.log", "wb")
    client_cmd = client_command(args.vllm, port, tokenizer, args, rate, n, out)
    client = subprocess.Popen(
        ["taskset", "-c", args.client_cpus, *client_cmd],
        stdout=client_log,
        stderr=subprocess.STDOUT,
    )
    try:
        quiet = wait_quiet(args.cpus, args.quiet_limit, args.quiet_timeout_s, args.lock)
        with held(args.lock) as waited:
            t0 = time.monotonic()
            proc = subprocess.Popen(
                ["taskset", "-c", args.cpus, *server], env=env,
                stdout=server_log, stderr=subprocess.STDOUT,
            )  # fmt: skip
            busy0, server_cpu = cpu_busy_s(args.cpus), 0.0
            try:
                while client.poll() is None:
                    if proc.poll() is not None:
                        raise RuntimeError(f"{engine} server exited with {proc.returncode}")
                    server_cpu = tree_cpu_s(proc.pid)
                    time.sleep(0.5)
                elapsed = time.monotonic() - t0
                busy = cpu_busy_s(args.cpus) - busy0
            finally:
                stop(proc)
    finally:
        stop(client)
        client_log.close()
        server_log.close()
    if client.returncode != 0 or not out.exists():
        tail = (workdir / f"{tag}.client.log").read_text(errors="replace")[-2000:]
        raise RuntimeError(f"vllm bench serve failed ({client.returncode}): {tail}")
    point = read_point(engine, out, workdir / f"{tag}.server.log")
    point["cpus_busy_before"] = quiet
    point["lock_wait_s"] = waited
    point["held_s"] = elapsed
    point["server_cpu_s"] = server_cpu
    point["cpus_busy_s"] = busy
    point["server_cpu_share"] = server_cpu / busy if busy else math.nan
    return point


def run_engine(
    engine: str,
    tokenizer: Path,
    workdir: Path,
    args: argparse.Namespace,
    row: dict[str, Any],
    done: Callable[[], None],
) -> None:
    """One engine's saturation point and its rising rate points (module docs),
    filled into ``row`` (``saturation``, ``points``, ``highest_rate_under_bound``);
    ``done`` is called after each point."""
    row["points"] = []
    row["highest_rate_under_bound"] = 0.0
    if args.saturation_prompts > 0:
        sat = run_point(engine, math.inf, args.saturation_prompts, tokenizer, workdir, args)
        row["saturation"] = sat
        done()
        print(
            f"{engine}: saturated {sat['output_throughput']:.2f} output tok/s, "
            f"{sat['request_throughput']:.3f} req/s, TPOT p90 {sat['tpot_p90_ms']:.0f} ms, "
            f"server CPU share {sat['server_cpu_share']:.2f}",
            flush=True,
        )
    for rate in sorted(args.rates):
        n = prompts_for_rate(rate, args.span_s, args.min_prompts, args.max_prompts)
        p = run_point(engine, rate, n, tokenizer, workdir, args)
        row["points"].append(p)
        row["highest_rate_under_bound"] = highest_rate_under(
            row["points"], args.output_len, args.tpot_bound_ms
        )
        done()
        print(
            f"{engine}: rate {rate:g} ({n} prompts): TPOT p50/p90 {p['tpot_p50_ms']:.0f}/"
            f"{p['tpot_p90_ms']:.0f} ms, TTFT p90 {p['ttft_p90_ms'] / 1e3:.1f} s, "
            f"{p['output_throughput']:.2f} output tok/s, outputs {p['output_len_min']}-"
            f"{p['output_len_max']} tokens, server CPU share {p['server_cpu_share']:.2f}",
            flush=True,
        )
        if not point_ok(p, args.output_len, args.tpot_bound_ms) and not args.no_stop:
            break


def table_rows(engines: dict[str, Any]) -> list[list[Any]]:
    """One row per engine and point for ``print_table``."""
    rows = []
    for name, row in engines.items():
        points = ([row["saturation"]] if "saturation" in row else []) + row["points"]
        for p in points:
            rows.append(
                [
                    name,
                    "inf" if math.isinf(p["request_rate"]) else p["request_rate"],
                    p["num_prompts"],
                    p["tpot_p50_ms"],
                    p["tpot_p90_ms"],
                    p["ttft_p50_ms"] / 1e3,
                    p["ttft_p90_ms"] / 1e3,
                    p["output_throughput"],
                    f"{p['output_len_min']}-{p['output_len_max']}",
                    p["failed"],
                    p["server_cpu_share"],
                ]
            )
    return rows


TABLE_HEADER = [
    "engine", "req/s", "prompts", "TPOT p50 ms", "TPOT p90 ms", "TTFT p50 s", "TTFT p90 s",
    "out tok/s", "out tokens", "failed", "CPU share",
]  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="the GGUF file")
    ap.add_argument("--llama-server", type=Path, help="llama.cpp's llama-server binary")
    ap.add_argument("--vllm", default=DEFAULT_VLLM, help="vLLM's CLI (for `vllm bench serve`)")
    ap.add_argument(
        "--engines", nargs="*", default=list(ENGINES), choices=ENGINES, help="engines to run"
    )
    ap.add_argument("--rates", type=float, nargs="*", default=[], help="request rates (req/s)")
    ap.add_argument("--span-s", type=float, default=150.0, help="seconds of arrivals per rate")
    ap.add_argument("--min-prompts", type=int, default=16)
    ap.add_argument("--max-prompts", type=int, default=64)
    ap.add_argument("--saturation-prompts", type=int, default=16, help="0: no saturation point")
    ap.add_argument("--input-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument(
        "--context-margin",
        type=int,
        default=16,
        help="context tokens per sequence over input + output",
    )
    ap.add_argument("--tpot-bound-ms", type=float, default=200.0)
    ap.add_argument("--no-stop", action="store_true", help="run every rate, past the bound")
    ap.add_argument("--cpus", default="1", help="taskset CPU list of the servers")
    ap.add_argument("--client-cpus", default="0", help="taskset CPU list of the client")
    ap.add_argument("--threads", type=int, default=1, help="threads of each server")
    ap.add_argument("--lock", type=Path, help="flock this file around each point")
    ap.add_argument(
        "--quiet-limit", type=float, default=0.25, help="start a point when --cpus are busier less"
    )
    ap.add_argument("--quiet-timeout-s", type=float, default=1800.0)
    ap.add_argument("--workdir", type=Path, help="keep the client's results and logs here")
    ap.add_argument("--save", type=Path, help="write the result JSON here")
    ap.add_argument(
        "--reuse",
        type=Path,
        nargs="*",
        default=[],
        help="saved results whose other engines' rows join this one's (the later file wins)",
    )
    ap.add_argument(
        "--reread",
        nargs="*",
        default=[],
        metavar="ENGINE=DIR",
        help="re-read a reused engine's points from the client results and logs kept in DIR",
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object last")
    args = ap.parse_args()  # fmt: skip

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="serving_peers_"))
    workdir.mkdir(parents=True, exist_ok=True)
    engines: dict[str, Any] = {}

    def save() -> None:
        if args.save:
            args.save.write_text(json.dumps(json_safe(summary(engines, args)), indent=1) + "\n")

    for path in args.reuse:
        reused = json.loads(path.read_text())["engines"]
        for name, row in reused.items():
            for p in [row.get("saturation", {}), *row["points"]]:  # JSON's "inf" as a float
                if "request_rate" in p:
                    p["request_rate"] = float(p["request_rate"])
            if name not in args.engines:
                engines[name] = merge_rows(engines.get(name), row)
    for spec in args.reread:
        name, _, folder = spec.partition("=")
        reread(engines[name], name, Path(folder), args.output_len, args.tpot_bound_ms)
    for name in args.engines:
        engines[name] = {}
    if args.reread or not args.engines:
        save()

    if args.engines:
        tokenizer = write_tokenizer(args.model, workdir / "tokenizer")
    for name in args.engines:
        run_engine(name, tokenizer, workdir, args, engines[name], save)
    result = summary(engines, args)
    print_table(
        f"vllm bench serve, random {args.input_len} in / {args.output_len} out, "
        f"{args.model.name}, {result['cpu']} ({result['cpu_family_model']}), CPUs {args.cpus}, "
        f"{args.threads} thread(s)",
        TABLE_HEADER,
        table_rows(result["engines"]),
    )
    for name, rate in result["highest_rate_under_bound"].items():
        print(f"{name}: highest rate with TPOT p90 < {args.tpot_bound_ms:g} ms: {rate:g} req/s")
    if result["ratio"] is not None:
        met = "met" if result["ratio"] >= 2 else "not met"
        print(f"pagedrs / llama.cpp: {result['ratio']:.2f}x (goal 2x: {met})")
    save()
    if args.json:
        print(json.dumps(json_safe(result)))


def merge_rows(a: dict[str, Any] | None, b: dict[str, Any]) -> dict[str, Any]:
    """Two saved rows of one engine as one: ``b``'s saturation point where it
    has one, else ``a``'s; the points of both by rate (``b``'s where both have
    a rate)."""
    if a is None:
        return b
    out = dict(a)
    if "saturation" in b:
        out["saturation"] = b["saturation"]
    points = {float(p["request_rate"]): p for p in a["points"]}
    points.update({float(p["request_rate"]): p for p in b["points"]})
    out["points"] = [points[r] for r in sorted(points)]
    return out


def summary(engines: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """The result object: the run's settings, each engine's points (in
    ``ENGINES`` order), each engine's highest rate under the bound and the
    ratio pagedrs / llama.cpp (None unless both engines have a nonzero rate)."""
    ordered = {name: engines[name] for name in ENGINES if name in engines}
    best = {
        name: highest_rate_under(row.get("points", []), args.output_len, args.tpot_bound_ms)
        for name, row in ordered.items()
    }
    for name, row in ordered.items():
        row["highest_rate_under_bound"] = best[name]
    ratio = (
        best["pagedrs"] / best["llama.cpp"]
        if best.get("llama.cpp") and best.get("pagedrs")
        else None
    )
    return {
        "benchmark": "serving_peers",
        "model": args.model.name,
        "cpu": cpu_name(),
        "cpu_family_model": cpu_family_model(),
        "cpus": args.cpus,
        "client_cpus": args.client_cpus,
        "threads": args.threads,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "tpot_bound_ms": args.tpot_bound_ms,
        "engines": ordered,
        "highest_rate_under_bound": best,
        "ratio": ratio,
        "date": date.today().isoformat(),
        "command": shlex.join(["python", *sys.argv]),
    }


if __name__ == "__main__":
    main()
