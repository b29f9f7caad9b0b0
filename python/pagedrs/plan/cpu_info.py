"""What a CPU profile records of the machine: the CPU's name, clock, vector
extensions (from ``/proc/cpuinfo``), FP32 FLOP per cycle and memory copy
bandwidth (measured with numpy)."""

from __future__ import annotations

import platform
import time
from pathlib import Path

import numpy as np


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``, else ``platform.processor()``)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def cpu_ghz() -> float:
    """The highest ``cpu MHz`` of ``/proc/cpuinfo`` in GHz (3.0 when unknown)."""
    try:
        mhz = [
            float(line.split(":", 1)[1])
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("cpu MHz")
        ]
        if mhz:
            return max(mhz) / 1e3
    except OSError:
        pass
    return 3.0


def copy_bandwidth() -> float:
    """Bytes/s read plus written by the best of 5 copies of 256 MiB (numpy)."""
    a = np.ones(32 << 20, dtype=np.float64)
    b = np.empty_like(a)
    best = np.inf
    for _ in range(5):
        t = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - t)
    return 2 * a.nbytes / best


def cpu_flags() -> set[str]:
    """The ``flags`` of ``/proc/cpuinfo`` (empty when unreadable)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_isa() -> str:
    """The vector extensions the CPU's kernels may use, from /proc/cpuinfo:
    "AVX-512 (F, BF16, VNNI)", "AVX2" or "no AVX2"."""
    flags = cpu_flags()
    if "avx512f" in flags:
        extra = [n for f, n in (("avx512_bf16", "BF16"), ("avx512_vnni", "VNNI")) if f in flags]
        return "AVX-512 (" + ", ".join(["F", *extra]) + ")"
    return "AVX2" if "avx2" in flags else "no AVX2"


def flops_per_cycle() -> int:
    """FP32 FLOP per cycle of one core: two FMA pipes of 512 bits with
    AVX-512F, of 256 bits with AVX2 (read from /proc/cpuinfo's flags)."""
    flags = cpu_flags()
    if not flags:
        return 32
    return 64 if "avx512f" in flags else 32 if "avx2" in flags else 16
