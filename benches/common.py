"""Shared helpers of the benchmarks: request data from ../shared/data, output tables."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

DATA_DIR = Path(
    os.environ.get("PAGEDRS_DATA", Path(__file__).resolve().parents[2] / "shared" / "data")
)


def alpaca_prompts(n: int) -> list[str]:
    """The first ``n`` Alpaca-like instructions (instruction + input), as user messages."""
    records = json.loads((DATA_DIR / "alpaca_en_demo.json").read_text())
    out = []
    for r in records[:n]:
        text = r["instruction"] + (("\n\n" + r["input"]) if r.get("input") else "")
        out.append(text)
    return out


def print_table(title: str, header: list[str], rows: list[list[Any]]) -> None:
    """A fixed-width table on stdout."""
    cells = [[str(c) for c in header]] + [
        [f"{c:.2f}" if isinstance(c, float) else str(c) for c in r] for r in rows
    ]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    print(f"\n{title}")
    for i, r in enumerate(cells):
        print("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))
        if i == 0:
            print("  ".join("-" * w for w in widths))
