"""Hardware profiles of the step-time model: a device's peak rates and the
efficiencies that turn them into achieved rates, read from a JSON file.

The packaged profiles (``pagedrs/plan/profiles/*.json``) are A100-80G, H100
and H200 (SXM) from their vendors' published peak figures, with the
efficiencies each file states, and the CPU profile fitted on this machine by
``pagedrs plan --calibrate``. A profile names itself by file stem
(``a100-80g``) or is given as a path.

Fields of a profile (units in the names):

* ``name``, ``source``: label, where the figures come from.
* ``peak_flops``: {compute dtype: FLOP/s} ("float32", "bfloat16", "float16", ...).
* ``memory_bandwidth_Bps``: device memory bandwidth, bytes/s.
* ``memory_bytes``: device memory per device, bytes.
* ``memory_utilization``: share of ``memory_bytes`` the engine may use
  (vLLM's ``gpu_memory_utilization``).
* ``activation_reserve_bytes``: memory kept for activations besides weights and KV.
* ``interconnect_Bps``, ``interconnect_latency_s``: one direction of the
  tensor-parallel link per device and the latency of one all-reduce.
* ``efficiency``: {"matmul", "attention", "memory", "interconnect"}: achieved
  share (0-1] of the peak for projections, attention arithmetic, memory
  traffic and the link; ``null`` for a term a fit found negligible.
* ``overhead_s``: fixed time per step (scheduling, launch, sampling), s.
* ``per_seq_s``: time per scheduled sequence per step, s.
* ``multi_token_s``: time added to a step of two or more tokens, s (on a CPU
  the projections of a one-token step run matrix-vector kernels that stream
  the weights once; two or more rows take the matrix-matrix kernels, which
  pack the weights first); 0 where the profile states none.
* ``few_token_s``: object, token count ("2" to "8") -> s added to a step of
  exactly that many tokens (the CPU's BLAS picks its kernels by row count,
  so a few rows do not cost in proportion: on the Zen 3 EPYC three rows of
  the LM head ran slower than four); fitted as the median residual of the
  calibration's steps of that size; absent: none.
* ``matmul_knee_tokens``: the fewest rows the
  projections of a step of two or more tokens are timed at: a step of
  ``T`` tokens counts ``2 P max(T, knee)`` projection FLOPs. Below the knee
  the matrix-matrix kernels are bound by streaming the packed weights, not
  by arithmetic (a roofline's memory side, stated in rows: on the Zen 5
  EPYC a decode step of 2 to ~10 sequences takes about the same time);
  fitted by the calibration, 0: none.
* ``combine``: "max" (a roofline: compute and memory overlap) or "sum"
  (they do not, as a CPU running one operator at a time).
* ``fit``: for fitted profiles, the calibration's points and held-back error.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["PROFILE_DIR", "HardwareProfile", "list_profiles", "load_profile"]

PROFILE_DIR = Path(__file__).with_name("profiles")

_EFFICIENCY_KEYS = ("matmul", "attention", "memory", "interconnect")


@dataclass(frozen=True)
class HardwareProfile:
    """One device's rates (see the module docstring for each field)."""

    name: str
    source: str
    peak_flops: dict[str, float]
    memory_bandwidth_Bps: float
    memory_bytes: float
    efficiency: dict[str, float | None]
    overhead_s: float
    per_seq_s: float = 0.0
    multi_token_s: float = 0.0
    few_token_s: dict[str, float] = field(default_factory=dict)
    matmul_knee_tokens: float = 0.0
    combine: str = "max"
    memory_utilization: float = 0.9
    activation_reserve_bytes: float = 0.0
    interconnect_Bps: float = 0.0
    interconnect_latency_s: float = 0.0
    fit: dict[str, Any] | None = field(default=None, compare=False)

    def flops(self, dtype: str) -> float:
        """Peak FLOP/s for ``dtype``.

        Raises:
            ValueError: the profile states no rate for it, naming both.
        """
        if dtype not in self.peak_flops:
            raise ValueError(
                f"profile {self.name!r}: peak_flops has no {dtype!r} entry "
                f"(has {sorted(self.peak_flops)})"
            )
        return self.peak_flops[dtype]

    def as_dict(self) -> dict[str, Any]:
        """The JSON object of the profile."""
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        if d["fit"] is None:
            del d["fit"]
        return d

    def save(self, path: str | Path) -> None:
        """Write the profile as JSON."""
        Path(path).write_text(json.dumps(self.as_dict(), indent=2) + "\n")

    @classmethod
    def from_dict(cls, d: Any, where: str = "profile") -> HardwareProfile:
        """Validate and build from a JSON object.

        Raises:
            ValueError: a missing, unknown or out-of-range field, named with
                ``where`` (the file).
        """
        if not isinstance(d, dict):
            raise ValueError(f"{where}: a profile is a JSON object, got {type(d).__name__}")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(d) - known - {"notes"})
        if unknown:
            raise ValueError(f"{where}: unknown field {unknown[0]!r} (fields: {sorted(known)})")
        for req in ("name", "peak_flops", "memory_bandwidth_Bps", "memory_bytes", "efficiency"):
            if req not in d:
                raise ValueError(f"{where}: missing field {req!r}")

        def num(key: str, value: Any, lo: float = 0.0, hi: float | None = None) -> float:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{where}: field {key!r} must be a number, got {value!r}")
            if value < lo or (hi is not None and value > hi):
                rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
                raise ValueError(f"{where}: field {key!r} must be {rng}, got {value!r}")
            return float(value)

        if not isinstance(d["peak_flops"], dict) or not d["peak_flops"]:
            raise ValueError(f"{where}: field 'peak_flops' must be an object dtype -> FLOP/s")
        peak = {k: num(f"peak_flops.{k}", v, 1.0) for k, v in d["peak_flops"].items()}
        eff_in = d["efficiency"]
        if not isinstance(eff_in, dict):
            raise ValueError(f"{where}: field 'efficiency' must be an object")
        bad = sorted(set(eff_in) - set(_EFFICIENCY_KEYS))
        if bad:
            raise ValueError(
                f"{where}: unknown field 'efficiency.{bad[0]}' (fields: {list(_EFFICIENCY_KEYS)})"
            )
        eff: dict[str, float | None] = {}
        for k in _EFFICIENCY_KEYS:
            if k not in eff_in:
                raise ValueError(f"{where}: missing field 'efficiency.{k}'")
            v = eff_in[k]
            # A fitted profile's efficiencies are what the fit found (a cache
            # can beat the stated bandwidth); stated ones are shares of a peak.
            hi = None if d.get("fit") else 1.0
            eff[k] = None if v is None else num(f"efficiency.{k}", v, 1e-12, hi)
        few_in = d.get("few_token_s", {})
        if not isinstance(few_in, dict):
            raise ValueError(f"{where}: field 'few_token_s' must be an object token count -> s")
        few: dict[str, float] = {}
        for k, v in few_in.items():
            if not str(k).isdigit() or not 2 <= int(k) <= 8:
                raise ValueError(f"{where}: field 'few_token_s' key {k!r} is not a count 2-8")
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"{where}: field 'few_token_s.{k}' must be a number, got {v!r}")
            few[str(int(k))] = float(v)
        combine = d.get("combine", "max")
        if combine not in ("max", "sum"):
            raise ValueError(f"{where}: field 'combine' must be 'max' or 'sum', got {combine!r}")
        name = d["name"]
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}: field 'name' must be a non-empty string")
        return cls(
            name=name,
            source=str(d.get("source", "")),
            peak_flops=peak,
            memory_bandwidth_Bps=num("memory_bandwidth_Bps", d["memory_bandwidth_Bps"], 1.0),
            memory_bytes=num("memory_bytes", d["memory_bytes"], 1.0),
            efficiency=eff,
            overhead_s=num("overhead_s", d.get("overhead_s", 0.0)),
            per_seq_s=num("per_seq_s", d.get("per_seq_s", 0.0)),
            multi_token_s=num("multi_token_s", d.get("multi_token_s", 0.0)),
            few_token_s=few,
            matmul_knee_tokens=num("matmul_knee_tokens", d.get("matmul_knee_tokens", 0.0)),
            combine=combine,
            memory_utilization=num(
                "memory_utilization", d.get("memory_utilization", 0.9), 0.0, 1.0
            ),
            activation_reserve_bytes=num(
                "activation_reserve_bytes", d.get("activation_reserve_bytes", 0.0)
            ),
            interconnect_Bps=num("interconnect_Bps", d.get("interconnect_Bps", 0.0)),
            interconnect_latency_s=num(
                "interconnect_latency_s", d.get("interconnect_latency_s", 0.0)
            ),
            fit=d.get("fit"),
        )


def list_profiles() -> list[str]:
    """Names of the packaged profiles."""
    return sorted(p.stem for p in PROFILE_DIR.glob("*.json"))


def load_profile(name_or_path: str | Path) -> HardwareProfile:
    """A packaged profile by name, or a JSON file.

    Raises:
        ValueError: unknown name, unreadable JSON (with its line) or a bad
            field (named).
    """
    path = Path(name_or_path)
    if not path.suffix == ".json" or not path.exists():
        packaged = PROFILE_DIR / f"{str(name_or_path).lower()}.json"
        if packaged.exists():
            path = packaged
        elif not path.exists():
            raise ValueError(
                f"unknown hardware profile {str(name_or_path)!r}: a JSON file or one of "
                f"{list_profiles()}"
            )
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: line {e.lineno}: {e.msg}") from e
    return HardwareProfile.from_dict(data, where=str(path))
