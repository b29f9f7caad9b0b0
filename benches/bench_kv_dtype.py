"""``bench_kv_quality.py`` under the name issue 16 gives it: quality and
capacity of each KV cache dtype against a float32 KV cache, the same options
and output (``--json``: ``{"capacity_vs_float32": ..., "quality": ...}``)."""

from __future__ import annotations

from bench_kv_quality import main

if __name__ == "__main__":
    main()
