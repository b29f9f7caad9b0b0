"""Compile every Triton kernel launch of pagedrs for sm_80 and sm_90 without a
GPU (``pagedrs.kernels.aot``) and print per launch the shared memory,
registers and spills (ptxas -v).

    PYTHONPATH=python python benches/triton_aot.py [--cases ci|full] [--processes N] [--json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from datetime import datetime, timezone

from pagedrs.kernels import aot


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cases", choices=("ci", "full"), default="full")
    parser.add_argument("--processes", type=int, default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    start = time.time()
    results = aot.compile_all(args.cases, processes=args.processes)
    cols = ("kernel", "arch", "case", "shared", "regs", "spill st/ld", "ok")
    print(" | ".join(cols))
    for r in sorted(results, key=lambda r: (r["kernel"], r["arch"])):
        c = r["case"]
        case = (
            f"{c['model_dtype']}/{c['kv_cache']} d{c['head_dim']} {c['num_heads']}/"
            f"{c['num_kv_heads']} bs{c['block_size']} w{int(c['window'])}c{int(c['softcap'])}"
            f"s{int(c['sinks'])} x{c['num_splits']}"
        )
        if r["ok"]:
            row = (
                r["kernel"],
                r["arch"],
                case,
                r["shared_bytes"],
                r["registers"],
                f"{r['spill_stores']}/{r['spill_loads']}",
                "ok",
            )
        else:
            row = (r["kernel"], r["arch"], case, "-", "-", "-", r["error"].splitlines()[0])
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
    if args.json:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout
        print(
            json.dumps(
                {
                    "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                    "commit": commit.strip(),
                    "cases": args.cases,
                    "results": results,
                }
            )
        )


if __name__ == "__main__":
    main()
