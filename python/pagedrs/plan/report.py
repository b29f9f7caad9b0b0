"""Output of a plan: fixed-width tables, the JSON object, and a plot
(matplotlib, imported only when a plot is asked for)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

__all__ = ["format_tables", "json_safe", "plot", "to_json"]

_COLUMNS = [
    ("rate", lambda r: r["request_rate"]),
    ("req/s", lambda r: r["throughput_rps"]),
    ("tok/s", lambda r: r["output_tokens_per_s"]),
    ("TTFT p50", lambda r: r["ttft_s"]["p50"] * 1e3),
    ("p90", lambda r: r["ttft_s"]["p90"] * 1e3),
    ("p99", lambda r: r["ttft_s"]["p99"] * 1e3),
    ("TPOT p50", lambda r: r["tpot_s"]["p50"] * 1e3),
    ("p90", lambda r: r["tpot_s"]["p90"] * 1e3),
    ("p99", lambda r: r["tpot_s"]["p99"] * 1e3),
    ("norm p50", lambda r: r["normalized_latency_s_per_token"]["p50"] * 1e3),
    ("p90", lambda r: r["normalized_latency_s_per_token"]["p90"] * 1e3),
    ("p99", lambda r: r["normalized_latency_s_per_token"]["p99"] * 1e3),
    ("batch", lambda r: r["batch_size_mean"]),
    ("KV use", lambda r: r["kv_usage_mean"]),
    ("KV util", lambda r: r["kv_utilization_mean"]),
    ("preempt", lambda r: r["num_preemptions"]),
    ("hit", lambda r: r["prefix_hit_rate"]),
]


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
    return str(v)


def table(title: str, header: list[str], rows: list[list[Any]]) -> str:
    """A fixed-width table."""
    cells = [header] + [[_fmt(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = [title]
    for i, r in enumerate(cells):
        lines.append("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_tables(results: list[dict[str, Any]], header: str = "") -> str:
    """One table per configuration (times in ms; KV use = blocks in use /
    blocks; KV util = token states / allocated slots; hit = prefix-cache hit
    rate) and, with an objective, the highest rate of each."""
    parts = [header] if header else []
    for res in results:
        rows = [[f(r) for _, f in _COLUMNS] for r in res["rows"]]
        parts.append(table(f"config: {res['label']}", [c for c, _ in _COLUMNS], rows))
    if any("max_rate" in r for r in results):
        rows = [[r["label"], _rate_text(r)] for r in results]
        parts.append(table("highest rate meeting the objective", ["config", "req/s"], rows))
    return "\n\n".join(parts)


def _rate_text(res: dict[str, Any]) -> str:
    """The highest rate; ">= x" when the search stopped before a failing rate."""
    rate = res.get("max_rate")
    bracket = res.get("bracket")
    if rate is None:
        return "-"
    if bracket and bracket[1] is None:
        return f">= {rate:.3g}"
    return f"{rate:.3g}"


def json_safe(x: Any) -> Any:
    """``x`` with non-finite floats as strict JSON allows (NaN -> None, inf -> "inf")."""
    if isinstance(x, dict):
        return {str(k): json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None if math.isnan(x) else ("inf" if x > 0 else "-inf")
    return x


def to_json(obj: Any) -> str:
    """One line of strict JSON."""
    return json.dumps(json_safe(obj))


def plot(results: list[dict[str, Any]], path: str | Path, title: str = "") -> None:
    """TTFT p90, TPOT p90, normalized latency (mean) and throughput against the
    request rate, one line per configuration, as a PNG.

    Raises:
        ValueError: matplotlib is not installed (``pip install matplotlib``).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ValueError("--plot needs matplotlib: pip install matplotlib") from e
    fig, axes = plt.subplots(1, 4, figsize=(19, 4.2))
    panels = [
        ("TTFT p90 (ms)", lambda r: r["ttft_s"]["p90"] * 1e3),
        ("TPOT p90 (ms)", lambda r: r["tpot_s"]["p90"] * 1e3),
        (
            "normalized latency, mean (ms/token)",
            lambda r: r["normalized_latency_s_per_token"]["mean"] * 1e3,
        ),
        ("output tokens/s", lambda r: r["output_tokens_per_s"]),
    ]
    for res in results:
        rows = [r for r in res["rows"] if r["request_rate"] is not None]
        rates = [r["request_rate"] for r in rows]
        for ax, (name, f) in zip(axes, panels, strict=True):
            ax.plot(rates, [f(r) for r in rows], "o-", label=res["label"])
            ax.set(xlabel="request rate (req/s)", ylabel=name)
    for res in results:
        if res.get("max_rate"):
            axes[1].axvline(res["max_rate"], ls=":", color="gray")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
