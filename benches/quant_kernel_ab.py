"""A/B timing of two builds of ``benches/quant_kernel.rs`` (the quantized
projection kernels alone, one thread): the two executables run alternately,
``--repeats`` times each, per format and row count, on the same core in the
same run; per (build, format, rows) the median of the repeats' GOP/s (each
repeat itself the median of the executable's rounds, in CPU time) and their
range.

    python benches/quant_kernel_ab.py BASE_EXE NEW_EXE --shape 2048,8192
        [--formats Q4_0,Q4_K] [--rows 1,16,64,256] [--acts int8]
        [--repeats 3] [--seconds 0.5] [--base-args ARGS] [--new-args ARGS]
        [--json OUT]

Build an executable with ``cargo bench --bench quant_kernel --no-run`` (the
path it prints) and copy it before building the other; run this under the
timing core's lock (``flock ... taskset -c 1``). ``--base-args`` and
``--new-args`` are extra arguments of each executable (one build twice, e.g.
``--base-args "--layout rows" --new-args "--layout panels"``). GOP/s counts a multiply-add
as two operations (``2 rows N K / s``).
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import shlex
import statistics
import subprocess
from pathlib import Path

LINE = re.compile(
    r"^\s*(?P<fmt>\S+)\s+(?P<acts>int8|int16) rows=(?P<rows>\d+)\s+projection\s+"
    r"(?P<ms>[\d.]+) ms \(\s*(?P<gops>[\d.]+) GOP/s"
)


def cpu_info() -> dict[str, str]:
    """The first CPU's ``model name``, ``cpu family`` and ``model`` from
    ``/proc/cpuinfo`` (``{"model name": platform.processor()}`` where that
    file is missing)."""
    keys = ("model name", "cpu family", "model")
    out: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in keys and key.strip() not in out:
                out[key.strip()] = value.strip()
    except OSError:
        out["model name"] = platform.processor()
    return out


def run_once(
    exe: str, shape: str, fmt: str, rows: int, acts: str, seconds: float, extra: list[str]
) -> dict:
    """One run of ``exe`` (with the arguments ``extra`` after the others) for
    one format and row count: ``{"ms", "gops"}``.

    Raises RuntimeError when its output has no projection line."""
    out = subprocess.run(
        [exe, shape, fmt, str(rows), "--acts", acts, "--seconds", str(seconds), *extra],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    for line in out.splitlines():
        m = LINE.match(line)
        if m:
            return {"ms": float(m["ms"]), "gops": float(m["gops"])}
    raise RuntimeError(f"no projection line in the output of {exe}:\n{out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base")
    ap.add_argument("new")
    ap.add_argument("--shape", default="2048,8192", help="N,K")
    ap.add_argument("--formats", default="Q4_0,Q4_K")
    ap.add_argument("--rows", default="1,16,64,256")
    ap.add_argument("--acts", default="int8")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=0.5)
    ap.add_argument("--base-args", default="", help="extra arguments of the base executable")
    ap.add_argument("--new-args", default="", help="extra arguments of the new executable")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    extra = {"base": shlex.split(args.base_args), "new": shlex.split(args.new_args)}
    results = []
    for fmt in args.formats.split(","):
        for rows in (int(r) for r in args.rows.split(",")):
            runs: dict[str, list[dict]] = {"base": [], "new": []}
            for _ in range(args.repeats):
                for key, exe in (("base", args.base), ("new", args.new)):
                    runs[key].append(
                        run_once(exe, args.shape, fmt, rows, args.acts, args.seconds, extra[key])
                    )
            entry: dict = {"format": fmt, "rows": rows, "acts": args.acts}
            for key, rs in runs.items():
                g = [r["gops"] for r in rs]
                entry[key] = {"gops": statistics.median(g), "min": min(g), "max": max(g)}
            entry["speedup"] = entry["new"]["gops"] / entry["base"]["gops"]
            results.append(entry)
            print(
                f"{fmt:>5} {args.acts} rows={rows:<4} base {entry['base']['gops']:7.1f} "
                f"new {entry['new']['gops']:7.1f} GOP/s  x{entry['speedup']:.2f}",
                flush=True,
            )
    if args.json:
        n, k = (int(v) for v in args.shape.split(","))
        doc = {
            "cpu": cpu_info(),
            "threads": 1,
            "shape": {"n": n, "k": k},
            "repeats": args.repeats,
            "seconds": args.seconds,
            "base_args": args.base_args,
            "new_args": args.new_args,
            "results": results,
        }
        args.json.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
