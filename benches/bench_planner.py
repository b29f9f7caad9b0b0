"""Validating the capacity planner (``pagedrs plan``, docs/planner.md).

``--mode engine`` / ``--mode serving``: the real engine (offline, in-process
as ``bench_throughput.py`` drives it) and the OpenAI server (streamed chat
completions as ``bench_serving.py`` sends them) against their simulation on
this machine with the fitted CPU profile (``pagedrs plan --calibrate``), the
ShareGPT-like and Alpaca-like traces of ../shared/data at 4+ Poisson rates:
throughput, TPOT p50, TTFT p50/p90 and the highest rate at a
normalized-latency bound, measured and simulated (``planner_engine.py``).
Run them with the calibration on one pinned core that nothing else runs on
(``taskset -c 1``; commands and figures in docs/planner.md, "Validation").

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

    python benches/bench_planner.py --mode engine|serving [--num-requests 24] [--threads 1]
        [--traces sharegpt,alpaca] [--sharegpt-rates 0.25,0.5,1,2] [--alpaca-rates 0.5,1,2,4]
        [--profile cpu] [--json]
    python benches/bench_planner.py --mode serving --resimulate RUN.json [--profile P] [--json]
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
from pagedrs.plan.sweep import max_rate, step_model_for
from pagedrs.plan.trace import Trace
from planner_engine import mode_engine, mode_serving, report
from planner_resim import resimulate_serving

# The paper's reported ranges (DESIGN.md): request rate of vLLM over Orca at
# the same latency, ShareGPT.
PAPER_RANGES = {"orca-oracle": (1.7, 2.7), "orca-max": (2.7, 8.0)}
ORCA = {"orca-max": "reserve-max", "orca-pow2": "reserve-pow2", "orca-oracle": "reserve-oracle"}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


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
    ap.add_argument(
        "--mode", default="engine", help="engine, serving, paper, scale (comma-separated)"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    e = ap.add_argument_group("engine and serving")
    e.add_argument("--profile", default="cpu", help="packaged profile name or JSON path")
    e.add_argument("--threads", type=int, default=1, help="torch threads of the engine")
    e.add_argument("--traces", type=lambda s: s.split(","), default=["sharegpt", "alpaca"])
    e.add_argument("--max-num-batched-tokens", type=int, default=2048)
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
    e.add_argument(
        "--latency-bound-ms",
        type=float,
        default=None,
        help="mean normalized latency bound, ms/token (default: --bound-factor x the "
        "simulated lowest rate's)",
    )
    e.add_argument("--bound-factor", type=float, default=2.0)
    e.add_argument(
        "--api-cpus",
        choices=("same", "other"),
        default="same",
        help="serving: the server's API process on the engine core's CPUs or the client's",
    )
    e.add_argument(
        "--resimulate",
        default=None,
        help="serving: re-simulate the measured run saved in this JSON file with --profile "
        "(nothing is measured)",
    )
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
            report(result["engine"], "planner vs the offline engine on this machine")
        elif mode == "serving" and ns.resimulate:
            result["serving"] = resimulate_serving(ns)
            report(result["serving"], f"planner vs pagedrs serve, re-simulated ({ns.resimulate})")
        elif mode == "serving":
            result["serving"] = mode_serving(ns)
            report(result["serving"], "planner vs pagedrs serve on this machine")
        elif mode == "paper":
            result["paper"] = mode_paper(ns)
            report_paper(result["paper"])
        elif mode == "scale":
            result["scale"] = mode_scale(ns)
            report_scale(result["scale"])
        else:
            raise SystemExit(f"unknown mode {mode!r}: engine, serving, paper, scale")
        result.setdefault("wall_s", {})[mode] = time.perf_counter() - t0
    if ns.json:
        import json

        print(json.dumps(json_safe(result)))


if __name__ == "__main__":
    main()
