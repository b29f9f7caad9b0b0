"""Validating the capacity planner (``pagedrs plan``, docs/planner.md).

``--mode engine``: the real engine against its simulation on this machine.
The ShareGPT-like and Alpaca-like traces of ../shared/data at 4+ Poisson
rates; each rate is run by ``LLMEngine`` in-process (as
``bench_throughput.py`` drives it: a request is added once its arrival time
has passed, greedy, exactly the trace's output length, a fresh cache salt per
run), recording each request's first-token and finish times, and simulated
by ``pagedrs.plan.simulate`` on the same arrivals with the same scheduler
settings and KV blocks and the fitted CPU profile (``pagedrs plan
--calibrate``). Reported per rate: throughput, TPOT p50, TTFT p50/p90,
measured and simulated; and the highest rate at a normalized-latency bound
(interpolated between the swept rates as ``bench_throughput.py`` does, the
same rule on both curves).

``--mode paper``: OPT-13B on one A100-80G (the packaged profile), the
ShareGPT-like and Alpaca-like traces, paged (block 16) against the paper's
Orca baselines as allocation policies of the same scheduler (Max / Pow2 /
Oracle, token-granular: block size 1); prefix caching off as in the paper's
main experiment. Reported: each system's highest rate at the mean
normalized-latency bound (bisection) and the ratios paged / Orca, beside the
paper's ranges.

``--mode scale``: Llama-3-8B replicas on H100s (the packaged profile) behind
each router for the multi-turn chat trace: 1 to 64 replicas at a fixed
session rate per replica, hit rate, TTFT p50/p90, throughput; then the
replicas each router needs for a target request rate at a TTFT p90 bound.

With ``--json`` the last line is one JSON object of every mode run.

    python benches/bench_planner.py --mode engine [--num-requests 24]
        [--sharegpt-rates 0.25,0.5,1,2] [--alpaca-rates 0.5,1,2,4] [--profile cpu] [--json]
    python benches/bench_planner.py --mode paper [--bound-ms 200] [--json]
    python benches/bench_planner.py --mode scale [--replicas 1,2,4,...,64] [--json]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import replace
from typing import Any

import numpy as np
from common import json_safe, print_table
from pagedrs.plan import (
    SLO,
    PlanConfig,
    load_profile,
    load_trace,
    resolve_model_shape,
    simulate,
    summarize,
)
from pagedrs.plan.metrics import latency_summary
from pagedrs.plan.sweep import max_rate, step_model_for
from pagedrs.plan.trace import Trace

# The paper's reported ranges (DESIGN.md): request rate of vLLM over Orca at
# the same latency, ShareGPT.
PAPER_RANGES = {"orca-oracle": (1.7, 2.7), "orca-max": (2.7, 8.0)}
ORCA = {"orca-max": "reserve-max", "orca-pow2": "reserve-pow2", "orca-oracle": "reserve-oracle"}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def max_rate_at_bound(rates: list[float], lat: list[float], bound: float) -> tuple[float, str]:
    """``bench_throughput.max_rate_at_bound``: the first rate over ``bound``
    ends the search; the crossing is interpolated from the rate before it."""
    for j, (r, x) in enumerate(zip(rates, lat, strict=True)):
        if not x <= bound:
            if j == 0:
                return 0.0, "<"
            r0, x0 = rates[j - 1], lat[j - 1]
            return r0 + (r - r0) * (bound - x0) / (x - x0), ""
    return rates[-1], ">="


# ------------------------------------------------------------------ engine mode


def run_engine(engine: Any, trace: Trace, salt: str) -> dict[str, np.ndarray]:
    """Replay ``trace`` (arrivals set) on an ``LLMEngine``: per-request arrival,
    first-token and finish times (s from the start)."""
    from pagedrs import SamplingParams

    reqs = trace.requests
    n = len(reqs)
    first = np.full(n, math.nan)
    finish = np.full(n, math.nan)
    arrival = np.asarray([r.arrival_s for r in reqs])
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
        outs = engine.step()
        done = time.perf_counter() - t0
        for o in outs:
            i = int(o.request_id[1:])
            if math.isnan(first[i]) and o.outputs[0].token_ids:
                first[i] = done
            if o.finished:
                finish[i] = done
    out = np.asarray([r.output_len for r in reqs])
    return {"arrival": arrival, "first": first, "finish": finish, "output_len": out}


def mode_engine(ns: argparse.Namespace) -> dict[str, Any]:
    from pagedrs.engine.arg_utils import EngineArgs
    from pagedrs.engine.llm_engine import LLMEngine

    profile = load_profile(ns.profile)
    model = resolve_model_shape("smollm2-135m")
    settings = dict(
        block_size=16,
        max_num_seqs=ns.max_num_seqs,
        max_num_batched_tokens=2048,
        enable_prefix_caching=True,
    )
    engine = LLMEngine(
        EngineArgs(
            dtype="float32", num_gpu_blocks_override=ns.num_blocks, max_model_len=2048, **settings
        )
    )
    cfg = PlanConfig(dtype="float32", num_gpu_blocks=ns.num_blocks, max_model_len=2048, **settings)
    sm = step_model_for(model, profile, cfg)
    out: dict[str, Any] = {"profile": profile.name, "source": profile.source, "traces": {}}
    try:
        # warm-up (discarded)
        warm = load_trace("alpaca", num_requests=4, max_output_len=8).with_poisson(math.inf)
        run_engine(engine, warm, "warm")
        for name, rates in (("sharegpt", ns.sharegpt_rates), ("alpaca", ns.alpaca_rates)):
            trace = load_trace(
                name,
                num_requests=ns.num_requests,
                max_prompt_len=ns.max_prompt_len,
                max_output_len=ns.max_output_tokens,
            )
            rows = []
            for k, rate in enumerate(rates):
                timed = trace.with_poisson(rate, ns.seed)
                log(f"engine: {name} at {rate} req/s ({len(trace)} requests)")
                m = run_engine(engine, timed, f"{name}-{k}")
                meas = latency_summary(m["arrival"], m["first"], m["finish"], m["output_len"])
                sim = summarize(simulate(timed, cfg, sm), rate)
                rows.append({"request_rate": rate, "measured": meas, "simulated": sim})
            out["traces"][name] = {"stats": trace.stats(), "rows": rows}
    finally:
        engine.shutdown()
    # the normalized-latency bound: a multiple of the measured lowest-rate mean
    for name, t in out["traces"].items():
        rows = t["rows"]
        rates = [r["request_rate"] for r in rows]
        meas = [r["measured"]["normalized_latency_s_per_token"]["mean"] for r in rows]
        sim = [r["simulated"]["normalized_latency_s_per_token"]["mean"] for r in rows]
        bound = ns.bound_factor * meas[0]
        t["bound_s_per_token"] = bound
        t["max_rate_measured"] = max_rate_at_bound(rates, meas, bound)
        t["max_rate_simulated"] = max_rate_at_bound(rates, sim, bound)
        timeless = Trace(name, [replace(r, arrival_s=0.0) for r in timed.requests], False)
        found = max_rate(
            timeless, cfg, sm, SLO(norm_latency_ms=bound * 1e3), [r["simulated"] for r in rows]
        )
        t["max_rate_simulated_bisection"] = found["max_rate"]
    return out


def report_engine(res: dict[str, Any]) -> None:
    print(f"\nplanner vs engine on this machine; profile {res['profile']}: {res['source']}")
    for name, t in res["traces"].items():
        rows = []
        for r in t["rows"]:
            m, s = r["measured"], r["simulated"]

            def pair(f: Any, m: Any = m, s: Any = s) -> list[Any]:
                a, b = f(m), f(s)
                return [a, b, (b - a) / a * 100 if a else math.nan]

            rows.append(
                [r["request_rate"]]
                + pair(lambda x: x["output_tokens_per_s"])
                + pair(lambda x: x["tpot_s"]["p50"] * 1e3)
                + pair(lambda x: x["ttft_s"]["p50"] * 1e3)
                + pair(lambda x: x["ttft_s"]["p90"] * 1e3)
            )
        hdr = ["rate", "tok/s meas", "sim", "err%", "TPOT50 meas", "sim", "err%"]
        hdr += ["TTFT50 meas", "sim", "err%", "TTFT90 meas", "sim", "err%"]
        print_table(f"{name} ({t['stats']['num_requests']} requests)", hdr, rows)
        mm, ms = t["max_rate_measured"], t["max_rate_simulated"]
        err = (ms[0] - mm[0]) / mm[0] * 100 if mm[0] else math.nan
        print(
            f"max rate at {t['bound_s_per_token'] * 1e3:.1f} ms/token (mean normalized latency): "
            f"measured {mm[1]}{mm[0]:.3g}, simulated {ms[1]}{ms[0]:.3g} req/s ({err:+.1f}%); "
            f"planner bisection {t['max_rate_simulated_bisection']:.3g}"
        )


# ------------------------------------------------------------------- paper mode


def mode_paper(ns: argparse.Namespace) -> dict[str, Any]:
    model = resolve_model_shape("opt-13b")
    profile = load_profile("a100-80g")
    base = PlanConfig(
        dtype="float16", max_model_len=2048, enable_prefix_caching=False, max_num_seqs=256
    )
    systems = {"paged": base}
    for name, policy in ORCA.items():
        systems[name] = replace(base, block_size=1, allocation_policy=policy)
    slo = SLO(norm_latency_ms=ns.bound_ms)
    out: dict[str, Any] = {"bound_ms_per_token": ns.bound_ms, "traces": {}}
    plan = (
        ("sharegpt", [0.5, 1, 2, 4], ns.paper_requests),
        ("alpaca", [4, 8, 16, 32], ns.paper_alpaca_requests),
    )
    for tname, rates, n in plan:
        trace = load_trace(tname, max_prompt_len=1024, max_output_len=1024)
        trace = _cycle(trace, n)
        res: dict[str, Any] = {"stats": trace.stats(), "systems": {}}
        for sname, cfg in systems.items():
            t0 = time.perf_counter()
            sm = step_model_for(model, profile, cfg)
            rows = [summarize(simulate(trace.with_poisson(r, ns.seed), cfg, sm), r) for r in rates]
            found = max_rate(trace, cfg, sm, slo, rows, seed=ns.seed)
            res["systems"][sname] = {
                "max_rate": found["max_rate"],
                "bracket": found["bracket"],
                "batch_size_mean": [r["batch_size_mean"] for r in rows],
                "rows": rows,
                "num_gpu_blocks": rows[0]["num_gpu_blocks"],
                "sim_wall_s": time.perf_counter() - t0,
            }
            log(f"paper: {tname} {sname}: {found['max_rate']:.3g} req/s")
        paged = res["systems"]["paged"]["max_rate"]
        res["ratios"] = {
            s: paged / v["max_rate"] if v["max_rate"] else math.inf
            for s, v in res["systems"].items()
            if s != "paged"
        }
        out["traces"][tname] = res
    return out


def _cycle(trace: Trace, n: int) -> Trace:
    reqs = [trace.requests[i % len(trace.requests)] for i in range(n)]
    return Trace(trace.name, reqs, False)


def report_paper(res: dict[str, Any]) -> None:
    print(f"\nOPT-13B on one A100-80G (profile), bound {res['bound_ms_per_token']} ms/token")
    for tname, t in res["traces"].items():
        rows = []
        for s, v in t["systems"].items():
            ratio = t["ratios"].get(s)
            paper = PAPER_RANGES.get(s) if tname == "sharegpt" else None
            rows.append(
                [
                    s,
                    v["max_rate"],
                    "-" if ratio is None else f"{ratio:.2f}x",
                    "-" if paper is None else f"{paper[0]}-{paper[1]}x",
                    v["num_gpu_blocks"],
                ]
            )
        st = t["stats"]
        print_table(
            f"{tname} (mean prompt {st['mean_prompt_len']:.0f}, "
            f"output {st['mean_output_len']:.0f})",
            ["system", "max req/s", "paged / it", "paper", "KV blocks"],
            rows,
        )


# ------------------------------------------------------------------- scale mode


def mode_scale(ns: argparse.Namespace) -> dict[str, Any]:
    from pagedrs.plan.config import ROUTERS

    model = resolve_model_shape("llama-3-8b")
    profile = load_profile("h100")
    counts = [int(x) for x in ns.replicas.split(",")]
    sessions_needed = max(max(counts) * ns.sessions_per_replica, ns.target_sessions)
    t0 = time.perf_counter()
    chat = load_trace("chat", sessions=sessions_needed, turns=ns.turns, think_s=ns.think_s)
    build_s = time.perf_counter() - t0
    per = ns.turns
    out: dict[str, Any] = {"trace_build_s": build_s, "rows": [], "needed": {}}
    for r in counts:
        sub = Trace("chat", chat.requests[: r * ns.sessions_per_replica * per], False)
        for router in ROUTERS:
            cfg = PlanConfig(data_parallel_size=r, router=router, max_model_len=8192)
            sm = step_model_for(model, profile, cfg)
            rate = ns.session_rate * r
            row = summarize(simulate(sub.with_poisson(rate, ns.seed), cfg, sm, seed=ns.seed), rate)
            row |= {"replicas": r, "router": router, "num_requests": len(sub)}
            out["rows"].append(row)
            log(
                f"scale: {r} replicas, {router}: hit {row['prefix_hit_rate']:.3f}, "
                f"TTFT p90 {row['ttft_s']['p90'] * 1e3:.0f} ms, sim {row['sim_wall_s']:.1f} s"
            )
    # replicas needed for a target session rate at a TTFT p90 bound
    target = ns.target_session_rate
    n_sessions = int(ns.target_sessions)
    sub = Trace("chat", chat.requests[: n_sessions * per], False)
    slo = SLO(ttft_ms=ns.ttft_bound_ms, percentile=90)
    for router in ROUTERS:
        tried: dict[int, bool] = {}

        def ok(r: int, router: str = router, tried: dict[int, bool] = tried) -> bool:
            if r not in tried:
                cfg = PlanConfig(data_parallel_size=r, router=router, max_model_len=8192)
                sm = step_model_for(model, profile, cfg)
                res = simulate(sub.with_poisson(target, ns.seed), cfg, sm, seed=ns.seed)
                tried[r] = slo.meets(summarize(res, target))
            return tried[r]

        lo, hi = 0, 1
        while not ok(hi) and hi < 256:
            lo, hi = hi, hi * 2
        if ok(hi):
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if ok(mid):
                    hi = mid
                else:
                    lo = mid
        out["needed"][router] = {"replicas": hi if ok(hi) else None, "tried": tried}
        log(f"scale: {router} needs {hi} replicas for {target} sessions/s")
    out["target"] = {
        "session_rate": target,
        "sessions": n_sessions,
        "turns": per,
        "ttft_p90_bound_ms": ns.ttft_bound_ms,
    }
    return out


def report_scale(res: dict[str, Any]) -> None:
    rows = [
        [
            r["replicas"],
            r["router"],
            r["num_requests"],
            r["request_rate"],
            r["throughput_rps"],
            r["prefix_hit_rate"],
            r["ttft_s"]["p50"] * 1e3,
            r["ttft_s"]["p90"] * 1e3,
            r["tpot_s"]["p50"] * 1e3,
            r["sim_wall_s"],
        ]
        for r in res["rows"]
    ]
    print_table(
        "Llama-3-8B on H100 replicas, multi-turn chat (session rate scales with replicas)",
        [
            "replicas",
            "router",
            "requests",
            "sessions/s",
            "req/s",
            "hit",
            "TTFT50 ms",
            "TTFT90 ms",
            "TPOT50 ms",
            "sim s",
        ],
        rows,
    )
    t = res["target"]
    print(
        f"\nreplicas needed for {t['session_rate']} sessions/s ({t['turns']} turns each) at "
        f"TTFT p90 <= {t['ttft_p90_bound_ms']} ms: "
        + ", ".join(f"{k} {v['replicas']}" for k, v in res["needed"].items())
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--mode", default="engine", help="engine, paper, scale (comma-separated)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    e = ap.add_argument_group("engine")
    e.add_argument("--profile", default="cpu")
    e.add_argument("--num-requests", type=int, default=24)
    e.add_argument("--max-output-tokens", type=int, default=64)
    e.add_argument("--max-prompt-len", type=int, default=512)
    e.add_argument("--max-num-seqs", type=int, default=64)
    e.add_argument("--num-blocks", type=int, default=4096)
    e.add_argument(
        "--sharegpt-rates",
        type=lambda s: [float(x) for x in s.split(",")],
        default=[0.25, 0.5, 1.0, 2.0],
    )
    e.add_argument(
        "--alpaca-rates",
        type=lambda s: [float(x) for x in s.split(",")],
        default=[0.5, 1.0, 2.0, 4.0],
    )
    e.add_argument("--bound-factor", type=float, default=2.0)
    p = ap.add_argument_group("paper")
    p.add_argument("--bound-ms", type=float, default=200.0)
    p.add_argument("--paper-requests", type=int, default=300, help="ShareGPT-like requests")
    p.add_argument("--paper-alpaca-requests", type=int, default=2000, help="(records cycled)")
    s = ap.add_argument_group("scale")
    s.add_argument("--replicas", default="1,2,4,8,16,32,64")
    s.add_argument("--sessions-per-replica", type=int, default=24)
    s.add_argument("--session-rate", type=float, default=2.0, help="sessions/s per replica")
    s.add_argument("--turns", type=int, default=4)
    s.add_argument("--think-s", type=float, default=2.0)
    s.add_argument("--target-session-rate", type=float, default=40.0)
    s.add_argument("--target-sessions", type=int, default=800)
    s.add_argument("--ttft-bound-ms", type=float, default=500.0)
    ns = ap.parse_args()
    result: dict[str, Any] = {}
    for mode in ns.mode.split(","):
        t0 = time.perf_counter()
        if mode == "engine":
            result["engine"] = mode_engine(ns)
            report_engine(result["engine"])
        elif mode == "paper":
            result["paper"] = mode_paper(ns)
            report_paper(result["paper"])
        elif mode == "scale":
            result["scale"] = mode_scale(ns)
            report_scale(result["scale"])
        else:
            raise SystemExit(f"unknown mode {mode!r}: engine, paper, scale")
        result.setdefault("wall_s", {})[mode] = time.perf_counter() - t0
    if ns.json:
        import json

        print(json.dumps(json_safe(result)))


if __name__ == "__main__":
    main()
