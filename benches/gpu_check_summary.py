"""gpu_check.json from the device check's stage logs (the last JSON line of
each): decode attention bandwidth as a share of the HBM peak per context,
offline throughput eager vs CUDA graphs with the decode step breakdown, the
zoo's equality count, the ahead-of-time compile counts (``triton_aot.json``:
compiles, failures, spilling attention launches), the GPU, the date and the
commit.

    python benches/gpu_check_summary.py OUT_DIR

Writes ``OUT_DIR/gpu_check.json`` with whatever the logs hold; exits 1 when a
stage's figures are missing.
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def last_json(path: Path) -> dict[str, Any] | None:
    """The last line of ``path`` that parses as a JSON object, or None."""
    if not path.exists():
        return None
    for line in reversed(path.read_text(errors="replace").splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict):
                return value
    return None


def all_json(path: Path) -> list[dict[str, Any]]:
    """Every line of ``path`` that parses as a JSON object."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        if line.strip().startswith("{"):
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict):
                out.append(value)
    return out


def commit() -> str | None:
    """The commit the wheel was built from (dist/COMMIT), else git's HEAD."""
    marker = ROOT / "dist" / "COMMIT"
    if marker.exists():
        return " ".join(marker.read_text().split()) or None
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        )
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def summarize(out_dir: Path) -> tuple[dict[str, Any], list[str]]:
    """(gpu_check.json's content, the missing stages)."""
    zoo = last_json(out_dir / "c-zoo.log")
    kernels = last_json(out_dir / "d-kernels.log")
    throughput = last_json(out_dir / "e-throughput.log")
    missing = [
        name
        for name, value in (("zoo", zoo), ("kernels", kernels), ("throughput", throughput))
        if value is None or "skipped" in value
    ]
    result: dict[str, Any] = {
        "gpu": None,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit(),
        "decode_bandwidth_fraction": {},
        "tokens_per_s": {},
        "zoo_equal": zoo.get("zoo_equal") if zoo else None,
    }
    if kernels and "results" in kernels:
        result["gpu"] = kernels.get("device")
        result["peak_gbps"] = kernels.get("peak_gbps")
        result["copy_gbps"] = kernels.get("copy_gbps")
        result["decode_shape"] = kernels.get("shape")
        for r in kernels["results"]:
            ctx = str(r["context"])
            pct = r.get("paged_pct_peak")
            result["decode_bandwidth_fraction"][ctx] = None if pct is None else pct / 100
            result.setdefault("decode_gbps", {})[ctx] = r["paged_gbps"]
            result.setdefault("decode_time_over_sdpa", {})[ctx] = r["paged_over_sdpa_time"]
            result.setdefault("sdpa_bandwidth_fraction", {})[ctx] = (
                None if r.get("sdpa_pct_peak") is None else r["sdpa_pct_peak"] / 100
            )
        result["decode_numerics_ok"] = all(r.get("ok") for r in kernels["results"])
    if throughput and "modes" in throughput:
        result["throughput_model"] = throughput.get("model")
        details: dict[str, Any] = {}
        for mode, r in throughput["modes"].items():
            if "runs" not in r:
                details[mode] = r
                continue
            result["gpu"] = result["gpu"] or r.get("device")
            runs = r["runs"]
            largest = max(runs, key=int)
            result["tokens_per_s"][mode] = runs[largest]["output_tokens_per_s"]
            details[mode] = {
                "start_s": r.get("start_s"),
                "num_blocks": r.get("num_blocks"),
                "graph_sizes": r.get("graph_sizes"),
                "runs": runs,
            }
        result["throughput"] = details
        result["tokens_per_s_batch"] = max(
            (int(n) for r in throughput["modes"].values() for n in r.get("runs", {})),
            default=None,
        )
    if zoo and "models" in zoo:
        result["zoo"] = zoo["models"]
    aot_path = out_dir / "triton_aot.json"
    if aot_path.exists():
        aot = json.loads(aot_path.read_text())
        result["triton_aot"] = {
            k: aot.get(k)
            for k in ("cases", "compiles", "failed", "attention_spills", "seconds", "cpu")
        }
    for shapes in all_json(out_dir / "g-shapes.log"):
        for mode, r in shapes.get("modes", {}).items():
            if "runs" in r:
                runs = r["runs"]
                n = max(runs, key=int)
                result.setdefault("other_shapes", {})[f"{shapes['model']} {mode}"] = {
                    "num_seqs": int(n),
                    "output_tokens_per_s": runs[n]["output_tokens_per_s"],
                    "decode_step_ms": runs[n].get("decode_step_ms"),
                    "num_blocks": r.get("num_blocks"),
                }
    return result, missing


def main() -> int:
    out_dir = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("gpu_check_out")
    result, missing = summarize(out_dir)
    path = out_dir / "gpu_check.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"gpu: {result['gpu']}; commit {result['commit']}; {result['date']}")
    fractions = result["decode_bandwidth_fraction"]
    if fractions:
        print(
            "decode bandwidth / HBM peak: "
            + ", ".join(
                f"{c}: {'?' if f is None else f'{100 * f:.0f}%'}" for c, f in fractions.items()
            )
        )
    if result["tokens_per_s"]:
        print(
            f"output tokens/s at {result.get('tokens_per_s_batch')} seqs: "
            + ", ".join(f"{m} {v:.0f}" for m, v in result["tokens_per_s"].items())
        )
    print(f"zoo equal: {result['zoo_equal']}")
    if "triton_aot" in result:
        a = result["triton_aot"]
        print(
            f"ahead-of-time ({a['cases']}): {a['compiles']} compiles, {a['failed']} failed, "
            f"{a['attention_spills']} attention launches spill"
        )
    for name, r in result.get("other_shapes", {}).items():
        print(f"{name}: {r['output_tokens_per_s']:.0f} output tokens/s at {r['num_seqs']} seqs")
    print(f"wrote {path}")
    if missing:
        print(f"missing figures: {', '.join(missing)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
