"""The planner against the real engine on this machine (``bench_planner.py
--mode engine`` and ``--mode serving``).

``engine`` (offline, as ``bench_throughput.py`` drives ``LLMEngine``): the
planner's ShareGPT-like / Alpaca-like trace at each Poisson rate, run by an
in-process ``LLMEngine`` (a request added once its arrival time has passed,
greedy, exactly its output length, a fresh cache salt per run) and simulated
by ``pagedrs.plan.simulate`` on the same arrivals, scheduler settings and KV
blocks. Every engine step is logged with its batch's shape, so the step-time
model is compared step by step as well as per request.

``serving`` (online, as ``bench_serving.py --mode sweep`` drives
``pagedrs serve``): streamed chat completions at Poisson arrivals from
``bench_serving``'s trace (one slice of requests per rate); the server's
engine-core process runs on this process's CPUs, the client on the other
CPUs, the server's API process (HTTP, chat template, tokenization,
detokenization, streaming) beside the engine core (``--api-cpus same``) or
beside the client (``other``); its CPU time and CPU wait are reported per
rate (the step-time model times the engine's steps, not the API process's
work); the simulation
replays the prompt token ids the server saw (the chat template applied) at the
client's send times, from the server's prefix cache as it stands: every
prompt the server computed before the rate (warm-up, probes, earlier rates)
is computed first (``simulate(..., warm_prompts=...)``), since the server's
cache keeps them across rates and the traces' prompts share prefixes.

Both report per rate: output tokens/s, TPOT p50, TTFT p50/p90, measured and
simulated with their relative error, the load average before and after, a
probe of the machine's speed just before the rate against the profile (a few
decode steps; a probe far from 0 marks a run under other conditions than the
calibration's, to redo), the simulation again with the profile's step
times scaled by that probe (``scaled``: the machine's speed at the time of
the rate, measured before it, so a load change between calibration and
measurement is told apart from the model's error), and the highest rate at a
mean normalized-latency bound (``--latency-bound-ms``, or ``bound_factor``
x the simulated mean at the lowest rate; the same interpolation on every
curve).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import sys
import time
from dataclasses import replace
from typing import Any, cast

import numpy as np
from common import print_table
from pagedrs.plan import SLO, PlanConfig, load_profile, load_trace, resolve_model_shape, simulate
from pagedrs.plan import summarize as sim_summary
from pagedrs.plan.calibrate import measure_steps
from pagedrs.plan.metrics import latency_summary, rate_at_bound
from pagedrs.plan.step_time import StepShape, StepTimeModel
from pagedrs.plan.sweep import max_rate, step_model_for
from pagedrs.plan.trace import Trace, TraceRequest

GOALS = {"output_tokens_per_s": 0.10, "tpot_p50": 0.10, "ttft_p50": 0.20, "ttft_p90": 0.20}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def load() -> float:
    """The 1-minute load average."""
    return os.getloadavg()[0]


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (the server's engine-core process)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children(p))
    return out


def children(pid: int) -> list[int]:
    """The child processes of ``pid`` (none where /proc does not say)."""
    out: list[int] = []
    try:
        for task in os.scandir(f"/proc/{pid}/task"):
            with open(f"{task.path}/children") as f:
                out.extend(int(c) for c in f.read().split())
    except OSError:
        pass
    return out


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def pin_process(pid: int, cpus: list[int]) -> None:
    """Move every thread of process ``pid`` (not its children) to ``cpus``;
    threads it starts later inherit it."""
    for task in os.scandir(f"/proc/{pid}/task"):
        os.sched_setaffinity(int(task.name), cpus)


def sched_times(pid: int | None = None, tree: bool = True) -> tuple[float, float]:
    """(CPU seconds, seconds runnable but waiting for a CPU) summed over the
    threads of process ``pid`` (default: this one) and, with ``tree``, its
    descendants, from /proc/<pid>/task/*/schedstat; (nan, nan) where the
    kernel does not report it."""
    cpu = wait = 0.0
    seen = False
    root = os.getpid() if pid is None else pid
    for p in _tree(root) if tree else [root]:
        try:
            tasks = list(os.scandir(f"/proc/{p}/task"))
        except OSError:
            continue  # exited meanwhile
        for task in tasks:
            try:
                with open(f"{task.path}/schedstat") as f:
                    run_ns, wait_ns, _ = f.read().split()
            except (OSError, ValueError):
                continue
            cpu += int(run_ns) / 1e9
            wait += int(wait_ns) / 1e9
            seen = True
    return (cpu, wait) if seen else (math.nan, math.nan)


def cpu_wait_share(before: tuple[float, float], after: tuple[float, float]) -> float:
    """Of the time the process was runnable between two ``sched_times``, the
    share it waited for a CPU taken by another process (0 on a core to itself)."""
    cpu, wait = after[0] - before[0], after[1] - before[1]
    return wait / (cpu + wait) if cpu + wait > 0 else math.nan


def max_rate_at_bound(rates: list[float], lat: list[float], bound: float) -> tuple[float, str]:
    """``bench_throughput.max_rate_at_bound``: the first rate over ``bound``
    ends the search; the crossing is interpolated from the rate before it
    (``pagedrs.plan.metrics.rate_at_bound``)."""
    found = rate_at_bound(rates, lat, bound)
    return found["rate"], found["flag"]


def settings(ns: argparse.Namespace) -> dict[str, Any]:
    """The scheduler settings shared by the engine, the server and the simulation."""
    return dict(
        block_size=16,
        max_num_seqs=ns.max_num_seqs,
        max_num_batched_tokens=ns.max_num_batched_tokens,
        enable_prefix_caching=True,
    )


def run_engine(engine: Any, trace: Trace, salt: str) -> dict[str, Any]:
    """Replay ``trace`` (arrivals set) on an ``LLMEngine``: per-request arrival,
    first-token and finish times (s from the start), and each step's shape
    and wall seconds."""
    from pagedrs import SamplingParams

    reqs = trace.requests
    n = len(reqs)
    first = np.full(n, math.nan)
    finish = np.full(n, math.nan)
    arrival = np.asarray([r.arrival_s for r in reqs])
    core = engine.engine_core
    steps: list[tuple[StepShape, float]] = []
    nxt = 0
    t0 = time.perf_counter()
    while nxt < n or engine.has_unfinished_requests():
        now = time.perf_counter() - t0
        while nxt < n and arrival[nxt] <= now:
            r = reqs[nxt]
            params = SamplingParams(temperature=0.0, max_tokens=r.output_len, ignore_eos=True)
            engine.add_request(f"q{nxt}", r.prompt.tolist(), params, cache_salt=salt)
            nxt += 1
        if not engine.has_unfinished_requests():
            time.sleep(max(0.0, arrival[nxt] - (time.perf_counter() - t0)))
            continue
        ts = time.perf_counter()
        outs = engine.step()
        done = time.perf_counter() - t0
        batch = core.last_batch
        if batch is not None and batch.num_tokens:
            steps.append((StepShape.from_batch(batch), done - (ts - t0)))
        for o in outs:
            i = int(o.request_id[1:])
            if math.isnan(first[i]) and o.outputs[0].token_ids:
                first[i] = done
            if o.finished:
                finish[i] = done
    out = np.asarray([r.output_len for r in reqs])
    return {"arrival": arrival, "first": first, "finish": finish, "output_len": out, "steps": steps}


class ScaledStepModel:
    """A step-time model whose step times are multiplied by ``factor`` (the
    probe's measured / modelled step time); everything else is ``inner``'s."""

    def __init__(self, inner: StepTimeModel, factor: float) -> None:
        self.inner = inner
        self.factor = factor

    def __call__(self, s: StepShape) -> float:
        return self.factor * self.inner(s)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def scaled(sm: StepTimeModel, probe_rel: float) -> StepTimeModel:
    """``sm`` slowed to the probe's speed: a probe of -20% (the model 20%
    under the measured steps) scales the step times by 1 / 0.8."""
    return cast(StepTimeModel, ScaledStepModel(sm, 1.0 / (1.0 + probe_rel)))


def probe_engine(engine: Any, sm: StepTimeModel, seed: int) -> float:
    """The machine's speed now against the profile: decode steps of 1 and 8
    sequences (``calibrate.measure_steps``), the model's median relative
    error on them (negative: the machine is slower than calibrated)."""
    pts = measure_steps(engine, [(1, 32, 12), (8, 32, 6)], seed=seed)
    rel = [(sm(sh) - t) / t for _, sh, t in pts if sh.num_prefill_tokens == 0]
    return float(np.median(rel))


def step_errors(steps: list[tuple[StepShape, float]], sm: StepTimeModel) -> dict[str, Any]:
    """The step-time model against the engine's logged steps: relative error
    per step (median, p90), of decode-only and prefill-carrying steps, and of
    the summed time."""
    if not steps:
        return {}
    y = np.asarray([t for _, t in steps])
    pred = np.asarray([sm(s) for s, _ in steps])
    pre = np.asarray([s.num_prefill_tokens > 0 for s, _ in steps])
    rel = (pred - y) / y

    def part(mask: np.ndarray) -> dict[str, Any]:
        if not mask.any():
            return {"num_steps": 0}
        r = rel[mask]
        return {
            "num_steps": int(mask.sum()),
            "median_rel": float(np.median(r)),
            "median_abs_rel": float(np.median(np.abs(r))),
            "p90_abs_rel": float(np.percentile(np.abs(r), 90)),
            "measured_s": float(y[mask].sum()),
            "total_rel": float((pred[mask].sum() - y[mask].sum()) / y[mask].sum()),
        }

    return {"all": part(np.ones_like(pre)), "decode": part(~pre), "prefill": part(pre)}


STEP_LOG_FIELDS = [
    "num_tokens", "num_seqs", "num_sampled", "num_prefill_tokens", "attn_pairs",
    "kv_read_tokens", "measured_s", "model_s",
]  # fmt: skip


def _fields(s: StepShape) -> list[int]:
    return [
        s.num_tokens,
        s.num_seqs,
        s.num_sampled,
        s.num_prefill_tokens,
        s.attn_pairs,
        s.kv_read_tokens,
    ]


def _bounds(
    out: dict[str, Any], cfg: PlanConfig, sm: StepTimeModel, ns: argparse.Namespace
) -> None:
    """Per trace: the normalized-latency bound (``--latency-bound-ms``, or
    ``bound_factor`` x the simulated mean at the lowest rate: the calibrated
    model's, so no one measurement moves it) and the highest rate under it,
    measured, simulated at the swept rates, and by the planner's bisection."""
    for t in out["traces"].values():
        rows = t["rows"]
        rates = [r["request_rate"] for r in rows]
        meas = [r["measured"]["normalized_latency_s_per_token"]["mean"] for r in rows]
        sim = [r["simulated"]["normalized_latency_s_per_token"]["mean"] for r in rows]
        scl = [r["scaled"]["normalized_latency_s_per_token"]["mean"] for r in rows]
        if ns.latency_bound_ms:
            bound, how = ns.latency_bound_ms / 1e3, "stated"
        else:
            bound, how = ns.bound_factor * sim[0], f"{ns.bound_factor:g} x simulated lowest rate"
        t["bound_s_per_token"] = bound
        t["bound_from"] = how
        t["max_rate_measured"] = max_rate_at_bound(rates, meas, bound)
        t["max_rate_simulated"] = max_rate_at_bound(rates, sim, bound)
        t["max_rate_scaled"] = max_rate_at_bound(rates, scl, bound)
        # % change of the rate per % change of the latency at the crossing
        t["max_rate_elasticity"] = {
            "measured": rate_at_bound(rates, meas, bound)["elasticity"],
            "simulated": rate_at_bound(rates, sim, bound)["elasticity"],
        }
        trace: Trace = t.pop("_trace")
        timeless = Trace(trace.name, [replace(r, arrival_s=0.0) for r in trace.requests], False)
        found = max_rate(
            timeless, cfg, sm, SLO(norm_latency_ms=bound * 1e3), [r["simulated"] for r in rows]
        )
        t["max_rate_simulated_bisection"] = found["max_rate"]


def _profile(ns: argparse.Namespace, cfg: PlanConfig) -> tuple[Any, StepTimeModel]:
    profile = load_profile(ns.profile)
    return profile, step_model_for(resolve_model_shape("smollm2-135m"), profile, cfg)


def mode_engine(ns: argparse.Namespace) -> dict[str, Any]:
    """The offline engine against the simulation at each rate of each trace."""
    import torch
    from pagedrs.engine.arg_utils import EngineArgs
    from pagedrs.engine.llm_engine import LLMEngine

    torch.set_num_threads(ns.threads)
    st = settings(ns)
    engine = LLMEngine(
        EngineArgs(dtype="float32", num_gpu_blocks_override=ns.num_blocks, max_model_len=2048, **st)
    )
    cfg = PlanConfig(dtype="float32", num_gpu_blocks=ns.num_blocks, max_model_len=2048, **st)
    profile, sm = _profile(ns, cfg)
    out: dict[str, Any] = {
        "profile": str(ns.profile),
        "source": profile.source,
        "torch_threads": torch.get_num_threads(),
        "step_log_fields": STEP_LOG_FIELDS,
        "cpu_affinity": sorted(os.sched_getaffinity(0)),
        "traces": {},
    }
    try:
        warm = load_trace("alpaca", num_requests=4, max_output_len=8).with_poisson(math.inf)
        run_engine(engine, warm, "warm")
        for name in ns.traces:
            rates = ns.sharegpt_rates if name == "sharegpt" else ns.alpaca_rates
            trace = load_trace(
                name,
                num_requests=ns.num_requests,
                max_prompt_len=ns.max_prompt_len,
                max_output_len=ns.max_output_tokens,
            )
            rows = []
            for k, rate in enumerate(rates):
                timed = trace.with_poisson(rate, ns.seed)
                probe = probe_engine(engine, sm, 1000 + k)
                l0 = load()
                log(
                    f"engine: {name} at {rate} req/s ({len(trace)} requests), load {l0:.2f}, "
                    f"probe {probe:+.1%}"
                )
                c0, w0, q0 = time.process_time(), time.perf_counter(), sched_times()
                m = run_engine(engine, timed, f"{name}-{k}")
                cpu_over_wall = (time.process_time() - c0) / (time.perf_counter() - w0)
                wait_share = cpu_wait_share(q0, sched_times())
                meas = latency_summary(m["arrival"], m["first"], m["finish"], m["output_len"])
                sim = sim_summary(simulate(timed, cfg, sm), rate)
                rows.append(
                    {
                        "request_rate": rate,
                        "load_average": [l0, load()],
                        "probe_rel": probe,
                        "cpu_over_wall": cpu_over_wall,
                        "cpu_wait_share": wait_share,
                        "measured": meas,
                        "simulated": sim,
                        "scaled": sim_summary(simulate(timed, cfg, scaled(sm, probe)), rate),
                        "steps": step_errors(m["steps"], sm),
                        "step_log": [
                            [*_fields(sh), round(dt, 6), round(sm(sh), 6)] for sh, dt in m["steps"]
                        ],
                    }
                )
            out["traces"][name] = {"stats": trace.stats(), "rows": rows, "_trace": trace}
    finally:
        engine.shutdown()
    _bounds(out, cfg, sm, ns)
    return out


async def _send_all(
    url: str, model: str, part: list[Any], rate: float, seed: int
) -> tuple[list[Any], list[float]]:
    """``serving_client.run_rate`` with each request's send time (s from the
    first send) kept."""
    import random

    import httpx
    from serving_client import send

    rng = random.Random(seed)
    limits = httpx.Limits(max_connections=len(part) + 8, max_keepalive_connections=len(part))
    async with httpx.AsyncClient(
        base_url=url, timeout=httpx.Timeout(1800.0), limits=limits
    ) as client:
        tasks, sent = [], []
        t0 = time.perf_counter()
        for req in part:
            sent.append(time.perf_counter() - t0)
            tasks.append(asyncio.ensure_future(send(client, model, req)))
            await asyncio.sleep(rng.expovariate(rate))
        results = await asyncio.gather(*tasks)
    return list(results), sent


PROBE = [{"role": "user", "content": "Count from one to twenty, in words."}]


def probe_server(
    url: str, tok: Any, cfg: PlanConfig, sm: StepTimeModel, history: list[np.ndarray]
) -> float:
    """The server's speed now against the profile: one request of 16 output
    tokens alone, its TPOT against the simulated one (relative error of the
    simulation; negative: the machine is slower than calibrated); its prompt
    is added to ``history`` (the prompts the server has computed)."""
    from common import TraceRequest as ChatRequest
    from common import chat_prompt_ids

    (r,), _ = asyncio.run(_send_all(url, "smollm2-135m-instruct", [ChatRequest(PROBE, 16)], 1.0, 0))
    if not r.ok:
        raise SystemExit(f"probe request failed: {r.error}")
    ids = np.asarray(chat_prompt_ids(tok, PROBE), dtype=np.int64)
    probe = Trace("probe", [TraceRequest(ids, r.output_tokens, 0.0)], True)
    sim = simulate(probe, cfg, sm, warm_prompts=history)
    history.append(ids)
    tpot_sim = (sim.finish[0] - sim.first_token[0]) / (r.output_tokens - 1)
    tpot = (r.e2e - r.ttft) / (r.output_tokens - 1)
    return float((tpot_sim - tpot) / tpot)


def mode_serving(ns: argparse.Namespace) -> dict[str, Any]:
    """``pagedrs serve`` under Poisson load against the simulation."""
    from common import chat_prompt_ids
    from common import load_trace as serving_trace
    from pagedrs.executor.model_loader import hf_folder
    from serving_client import start_server, stop_server
    from transformers import AutoTokenizer

    st = settings(ns)
    cfg = PlanConfig(dtype="float32", num_gpu_blocks=ns.num_blocks, max_model_len=2048, **st)
    profile, sm = _profile(ns, cfg)
    tok = AutoTokenizer.from_pretrained(hf_folder("smollm2-135m-instruct"))
    server_cpus = sorted(os.sched_getaffinity(0))
    client_cpus = sorted(set(range(os.cpu_count() or 1)) - set(server_cpus)) or server_cpus
    flags = [
        "--dtype", "float32", "--torch-threads", str(ns.threads),
        "--num-gpu-blocks-override", str(ns.num_blocks), "--block-size", "16",
        "--max-num-seqs", str(ns.max_num_seqs),
        "--max-num-batched-tokens", str(ns.max_num_batched_tokens), "--enable-prefix-caching",
    ]  # fmt: skip
    out: dict[str, Any] = {
        "profile": str(ns.profile),
        "source": profile.source,
        "server_cpus": server_cpus,
        "client_cpus": client_cpus,
        "server_flags": flags,
        "traces": {},
    }
    history: list[np.ndarray] = []  # every prompt the server has computed, in order
    proc, url = start_server("smollm2-135m-instruct", 2048, flags)
    cores = [c for c in children(proc.pid) if "resource_tracker" not in _cmdline(c)]
    if len(cores) != 1:
        stop_server(proc)
        raise SystemExit(f"the server has {len(cores)} child processes, expected its engine core")
    core_pid = cores[0]
    out["engine_core_cpus"] = sorted(os.sched_getaffinity(core_pid))
    if ns.api_cpus == "other":
        pin_process(proc.pid, client_cpus)  # the API process; the engine core stays
    out["api_cpus"] = sorted(os.sched_getaffinity(proc.pid))
    os.sched_setaffinity(0, client_cpus)
    try:
        for name in ns.traces:
            rates = ns.sharegpt_rates if name == "sharegpt" else ns.alpaca_rates
            reqs = serving_trace(name, tok, ns.max_output_tokens, ns.max_prompt_len)
            need = ns.num_requests * len(rates) + 4
            if len(reqs) < need:
                raise SystemExit(f"{name}: {len(reqs)} usable requests, the sweep needs {need}")
            warm = reqs[-4:]
            asyncio.run(_send_all(url, "smollm2-135m-instruct", warm, 100.0, ns.seed))
            history.extend(np.asarray(chat_prompt_ids(tok, q.messages)) for q in warm)
            rows, whole = [], []
            for k, rate in enumerate(rates):
                part = reqs[k * ns.num_requests : (k + 1) * ns.num_requests]
                probe = probe_server(url, tok, cfg, sm, history)
                l0 = load()
                log(
                    f"serving: {name} at {rate} req/s ({len(part)} requests), load {l0:.2f}, "
                    f"probe {probe:+.1%}"
                )
                c0, w0 = sched_times(core_pid), time.perf_counter()
                a0 = sched_times(proc.pid, tree=False)
                results, sent = asyncio.run(
                    _send_all(url, "smollm2-135m-instruct", part, rate, ns.seed + k)
                )
                c1, a1 = sched_times(core_pid), sched_times(proc.pid, tree=False)
                cpu_over_wall = (c1[0] - c0[0]) / (time.perf_counter() - w0)
                bad = [r.error for r in results if not r.ok]
                if bad:
                    raise SystemExit(f"serving {name} at {rate}: {len(bad)} errors, {bad[0]}")
                arrival = np.asarray(sent)
                first = arrival + np.asarray([r.ttft for r in results])
                finish = arrival + np.asarray([r.e2e for r in results])
                olen = np.asarray([r.output_tokens for r in results])
                meas = latency_summary(arrival, first, finish, olen)
                treqs = []
                for r, q, a in zip(results, part, sent, strict=True):
                    ids = chat_prompt_ids(tok, q.messages)
                    if len(ids) != r.prompt_tokens:
                        raise SystemExit(
                            f"{name}: the server counted {r.prompt_tokens} prompt tokens, "
                            f"the chat template gives {len(ids)}"
                        )
                    treqs.append(TraceRequest(np.asarray(ids, dtype=np.int64), r.output_tokens, a))
                timed = Trace(f"{name}@{rate:g}", treqs, True)
                whole.extend(treqs)
                seen = list(history)  # the server's prompts before this rate
                history.extend(r.prompt for r in treqs)
                sim = sim_summary(simulate(timed, cfg, sm, warm_prompts=seen), rate)
                rows.append(
                    {
                        "request_rate": rate,
                        "load_average": [l0, load()],
                        "probe_rel": probe,
                        "cpu_over_wall": cpu_over_wall,
                        "cpu_wait_share": cpu_wait_share(c0, c1),
                        "api_cpu_s": a1[0] - a0[0],
                        "api_cpu_wait_share": cpu_wait_share(a0, a1),
                        "measured": meas,
                        "simulated": sim,
                        "scaled": sim_summary(
                            simulate(timed, cfg, scaled(sm, probe), warm_prompts=seen), rate
                        ),
                        "warm_prompts": len(seen),
                        "requests": [
                            [
                                round(a, 6),
                                round(r.ttft, 6),
                                round(r.e2e, 6),
                                len(q.prompt),
                                q.output_len,
                            ]
                            for r, q, a in zip(results, treqs, sent, strict=True)
                        ],
                    }
                )
            stats = {
                "num_requests": ns.num_requests,
                "mean_prompt_tokens": float(np.mean([len(r.prompt) for r in whole])),
                "mean_output_tokens": float(np.mean([r.output_len for r in whole])),
            }
            trace = Trace(name, whole[: ns.num_requests], False)
            out["traces"][name] = {"stats": stats, "rows": rows, "_trace": trace}
    finally:
        stop_server(proc)
    _bounds(out, cfg, sm, ns)
    return out


def _err(a: float, b: float) -> float:
    return (b - a) / a * 100 if a else math.nan


_METRICS = (
    lambda x: x["output_tokens_per_s"],
    lambda x: x["tpot_s"]["p50"] * 1e3,
    lambda x: x["ttft_s"]["p50"] * 1e3,
    lambda x: x["ttft_s"]["p90"] * 1e3,
)


def report(res: dict[str, Any], title: str) -> None:
    """The validation tables of one mode: measured against simulated with
    the profile as it is, then the errors of the simulation scaled by the
    probe; ``wait%``: the share of its runnable time the engine waited for
    a CPU another process held (0: a core to itself)."""
    print(f"\n{title}; profile {res['profile']}: {res['source']}")
    for name, t in res["traces"].items():
        rows, srows = [], []
        for r in t["rows"]:
            m, s, c = r["measured"], r["simulated"], r["scaled"]
            row: list[Any] = [
                r["request_rate"],
                f"{r['load_average'][0]:.1f}",
                f"{r.get('cpu_wait_share', math.nan) * 100:.0f}",
                f"{r['probe_rel'] * 100:+.1f}",
            ]
            for f in _METRICS:
                row += [f(m), f(s), _err(f(m), f(s))]
            if "steps" in r and r["steps"]:
                row.append(r["steps"]["all"]["median_rel"] * 100)
            rows.append(row)
            srows.append([r["request_rate"], *(_err(f(m), f(c)) for f in _METRICS)])
        hdr = ["rate", "load", "wait%", "probe%", "tok/s meas", "sim", "err%"]
        hdr += ["TPOT50 meas", "sim", "err%", "TTFT50 meas", "sim", "err%"]
        hdr += ["TTFT90 meas", "sim", "err%"]
        if rows and len(rows[0]) > len(hdr):
            hdr.append("step err% p50")
        print_table(f"{name} ({t['stats']['num_requests']} requests a rate)", hdr, rows)
        print_table(
            f"{name}: simulated with the step times scaled by the probe, err%",
            ["rate", "tok/s", "TPOT50", "TTFT50", "TTFT90"],
            srows,
        )
        mm, ms, mc = t["max_rate_measured"], t["max_rate_simulated"], t["max_rate_scaled"]
        print(
            f"max rate at {t['bound_s_per_token'] * 1e3:.1f} ms/token ({t['bound_from']}; mean "
            "normalized latency): "
            f"measured {mm[1]}{mm[0]:.3g}, simulated {ms[1]}{ms[0]:.3g} req/s "
            f"({_err(mm[0], ms[0]):+.1f}%), scaled by the probe {mc[1]}{mc[0]:.3g} "
            f"({_err(mm[0], mc[0]):+.1f}%); planner bisection "
            f"{t['max_rate_simulated_bisection']:.3g}; elasticity at the crossing (% rate per % "
            f"latency) measured {t['max_rate_elasticity']['measured']:.2g}, simulated "
            f"{t['max_rate_elasticity']['simulated']:.2g}"
        )
