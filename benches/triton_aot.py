"""Compile every Triton kernel launch of pagedrs for sm_80 and sm_90 without a
GPU (``pagedrs.kernels.aot``) and print per launch the shared memory,
registers and spills (ptxas -v). Exits 1 if a launch fails to compile or an
attention kernel spills registers.

    PYTHONPATH=python python benches/triton_aot.py [--cases full|heavy|ci] [--processes N]
        [--json] [--out FILE.json]

``--cases``: ``full`` (default) every configuration of ``aot.full_cases``;
``heavy`` the most register-hungry ones; ``ci`` those of the CI test.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from datetime import datetime, timezone

from pagedrs.kernels import aot


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cases", choices=sorted(aot.CASE_SETS), default="full")
    parser.add_argument("--processes", type=int, default=None)
    parser.add_argument("--json", action="store_true", help="print the results as one JSON line")
    parser.add_argument("--out", help="also write the JSON object to this file")
    args = parser.parse_args()
    start = time.time()
    results = aot.compile_all(args.cases, processes=args.processes)
    cols = ("kernel", "arch", "case", "BLOCK_M/N warps stages", "shared", "regs", "spill", "ok")
    print(" | ".join(cols))
    for r in sorted(results, key=lambda r: (r["kernel"], r["arch"])):
        c = r["case"]
        case = (
            f"{c['model_dtype']}/{c['kv_cache']} d{c['head_dim']} {c['num_heads']}/"
            f"{c['num_kv_heads']} bs{c['block_size']} w{int(c['window'])}c{int(c['softcap'])}"
            f"s{int(c['sinks'])} x{c['num_splits']}"
        )
        k = r["constexprs"]
        tile = (
            f"{k.get('BLOCK_M', '-')}/{k.get('BLOCK_N', '-')} {k.get('num_warps', 4)} "
            f"{k.get('num_stages', 'default')}"
        )
        if r["ok"]:
            row = (
                r["kernel"],
                r["arch"],
                case,
                tile,
                r["shared_bytes"],
                r["registers"],
                f"{r['spill_stores']}/{r['spill_loads']}",
                "ok",
            )
        else:
            row = (r["kernel"], r["arch"], case, tile, "-", "-", "-", r["error"].splitlines()[0])
        print(" | ".join(str(x) for x in row))
    bad = [r for r in results if not r["ok"]]
    spills = [
        r
        for r in results
        if r["ok"] and r["kernel"] in aot.NO_SPILL_KERNELS and r["spill_stores"] + r["spill_loads"]
    ]
    print(
        f"{len(results)} compiles, {len(bad)} failed, {len(spills)} attention kernels spill, "
        f"{time.time() - start:.0f} s"
    )
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    report = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "commit": commit.strip(),
        "cpu": _cpu_name(),
        "cases": args.cases,
        "seconds": round(time.time() - start),
        "compiles": len(results),
        "failed": len(bad),
        "attention_spills": len(spills),
        "results": results,
    }
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
            f.write("\n")
    if args.json:
        print(json.dumps(report))
    if bad or spills:
        sys.exit(1)


def _cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), with the core count."""
    name = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{name}, {os.cpu_count()} cores"


if __name__ == "__main__":
    main()
