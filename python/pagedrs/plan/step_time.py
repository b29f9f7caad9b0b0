"""The step-time model: how long one engine step takes, from the step's shape
(the scheduler's ``StepBatch``) on a hardware profile, instead of running the
forward pass.

Per step, with ``T`` scheduled tokens, ``S`` sequences, ``R`` sampled rows and
``tp`` tensor-parallel devices (every term divided over them):

* projections: ``2 * P * T + 2 * V * h * R`` FLOPs (``P`` projection weights,
  the LM head on sampled rows only; a step of two or more tokens counts
  ``max(T, matmul_knee_tokens)`` rows of ``P``: the profile's knee, below
  which the matrix-matrix kernels stream the weights and do not cost by the
  row) against reading every weight once
  (``P + V * h`` weights at the weight format's bytes);
* attention: ``4 * L * Hq * D`` FLOPs per (query token, context token) pair
  (causal inside a prefill chunk) against reading each sequence's context and
  writing the step's tokens in the KV cache dtype (``2 * L * Hkv`` entries a
  token);
* each part is a roofline, ``max(flops / (peak * eff), bytes / (bw * eff))``
  (profile ``combine`` "max"), or the sum of the two ("sum");
* ``tp > 1``: two all-reduces of ``T * h`` activations a layer, a ring over the
  link: ``2 (tp - 1) / tp * bytes / (link * eff) + latency`` each;
* plus ``overhead_s + per_seq_s * S``, and ``multi_token_s`` when ``T >= 2``
  (the profile's matrix-matrix kernel term), and ``few_token_s[T]`` for the
  few token counts the profile measured apart.

The same formulas size the KV cache: device memory times its utilization,
less the weights (over ``tp``) and the activation reserve, in blocks of
``block_size`` tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from .hardware import HardwareProfile
from .models import ModelShape

__all__ = ["WEIGHT_BYTES", "StepShape", "StepTimeModel", "kv_entry_bytes"]

#: Bytes per weight of each weight format (GGUF block formats with their scales:
#: Q8_0 34 bytes / 32 weights, Q4_0 18 / 32, Q4_1 20 / 32, Q4_K 144 / 256).
WEIGHT_BYTES: dict[str, float] = {
    "float32": 4.0,
    "bfloat16": 2.0,
    "float16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "q8_0": 34 / 32,
    "q4_0": 18 / 32,
    "q4_1": 20 / 32,
    "q4_k": 144 / 256,
    "int4": 0.5,
}

_ACT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1, "tf32": 4}


def kv_entry_bytes(kv_cache_dtype: str, model_dtype: str, head_dim: int) -> int:
    """Bytes of one entry (one token's key or value of one KV head) in the KV
    cache dtype (``"auto"``: the model's dtype); int8 counts its scale.

    Raises:
        ValueError: an unknown KV cache dtype (from
            :func:`pagedrs.attention.kv_cache_dtype.resolve_kv_cache_dtype`).
    """
    import torch

    from ..attention.kv_cache_dtype import resolve_kv_cache_dtype

    dt = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(
        model_dtype, torch.bfloat16
    )
    return resolve_kv_cache_dtype(kv_cache_dtype, dt).entry_bytes(head_dim)


@dataclass(frozen=True)
class StepShape:
    """What one step computes.

    Attributes:
        num_tokens: scheduled tokens ``T``.
        num_seqs: scheduled sequences ``S``.
        num_sampled: sampled rows ``R`` (sequences whose prompt is done).
        num_prefill_tokens: tokens of sequences scheduled with more than one token.
        attn_pairs: (query token, context token) pairs over the step.
        kv_read_tokens: context tokens read (each sequence's context once).
    """

    num_tokens: int
    num_seqs: int
    num_sampled: int
    num_prefill_tokens: int
    attn_pairs: int
    kv_read_tokens: int

    @classmethod
    def from_batch(cls, batch: Any) -> StepShape:
        """From a ``_core.StepBatch`` (``query_start_loc`` int32 ``[S+1]``,
        ``seq_lens`` int32 ``[S]``: context after the step)."""
        qsl = batch.query_start_loc.astype(np.int64)
        q = qsl[1:] - qsl[:-1]
        n = batch.seq_lens.astype(np.int64)
        t = int(batch.num_tokens)
        return cls(
            num_tokens=t,
            num_seqs=int(batch.num_seqs),
            num_sampled=int(batch.num_sampled_tokens),
            num_prefill_tokens=t - int(np.count_nonzero(q == 1)),
            attn_pairs=int(q @ n) - (int(q @ q) - t) // 2,
            kv_read_tokens=int(n.sum()),
        )

    @classmethod
    def from_lengths(cls, query_lens: list[int], seq_lens: list[int], sampled: int) -> StepShape:
        """From per-sequence query and context lengths (for what-if shapes)."""
        q = np.asarray(query_lens, dtype=np.int64)
        n = np.asarray(seq_lens, dtype=np.int64)
        return cls(
            int(q.sum()),
            len(q),
            sampled,
            int(q[q > 1].sum()),
            int((q * n - q * (q - 1) // 2).sum()),
            int(n.sum()),
        )


@dataclass(frozen=True)
class StepTimeModel:
    """Step time of ``model`` on ``profile``.

    Args:
        model: the model's shape.
        profile: the device.
        dtype: compute dtype (a ``peak_flops`` key of the profile).
        weight_dtype: weight format (a ``WEIGHT_BYTES`` key; default ``dtype``).
        kv_cache_dtype: KV cache dtype ("auto": ``dtype``).
        tp: tensor-parallel devices per replica.
    Raises:
        ValueError: an unknown weight format, KV cache dtype, or a dtype the
            profile has no rate for.
    """

    model: ModelShape
    profile: HardwareProfile
    dtype: str = "bfloat16"
    weight_dtype: str | None = None
    kv_cache_dtype: str = "auto"
    tp: int = 1

    def __post_init__(self) -> None:
        if self.weight_format not in WEIGHT_BYTES:
            raise ValueError(
                f"weight_dtype must be one of {sorted(WEIGHT_BYTES)}, got {self.weight_format!r}"
            )
        if self.tp < 1:
            raise ValueError(f"tensor-parallel size must be >= 1, got {self.tp}")
        if self.model.num_kv_heads % self.tp and self.tp % self.model.num_kv_heads:
            raise ValueError(
                f"tensor-parallel size {self.tp} does not divide the {self.model.num_kv_heads} "
                f"KV heads of {self.model.name}"
            )
        self.profile.flops(self.dtype)  # raises naming the dtype
        if self.tp > 1 and self.profile.interconnect_Bps <= 0:
            raise ValueError(
                f"profile {self.profile.name!r}: tensor parallelism needs interconnect_Bps > 0"
            )

    @property
    def weight_format(self) -> str:
        """The weight format in use."""
        return self.weight_dtype or self.dtype

    @cached_property
    def kv_bytes_per_token(self) -> float:
        """KV cache bytes one token takes on one device (its share over ``tp``)."""
        entry = kv_entry_bytes(self.kv_cache_dtype, self.dtype, self.model.head_dim)
        heads = max(1, self.model.num_kv_heads // self.tp)  # KV heads replicate past tp
        return 2 * self.model.num_layers * heads * entry

    @property
    def weight_bytes(self) -> float:
        """Weight bytes on one device."""
        return self.model.num_params * WEIGHT_BYTES[self.weight_format] / self.tp

    def num_blocks(self, block_size: int) -> int:
        """KV cache blocks that fit one device: ``memory_bytes *
        memory_utilization - weights - activation_reserve`` over a block's bytes.

        Raises:
            ValueError: the weights leave no room for the KV cache.
        """
        p = self.profile
        free = p.memory_bytes * p.memory_utilization - self.weight_bytes
        free -= p.activation_reserve_bytes
        blocks = int(free // (self.kv_bytes_per_token * block_size))
        if blocks < 1:
            raise ValueError(
                f"{self.model.name} ({self.weight_bytes / 1e9:.1f} GB of weights per device, "
                f"tp={self.tp}) leaves no KV cache memory on {p.name}"
            )
        return blocks

    @cached_property
    def _rates(self) -> tuple[float, ...]:
        """Seconds per unit of each term on one device (0: a term the profile
        leaves out): per projection FLOP, per attention FLOP, per byte, and
        the weights' bytes."""
        p, m, tp = self.profile, self.model, self.tp
        eff = p.efficiency
        peak, bw = p.flops(self.dtype), p.memory_bandwidth_Bps

        def per(rate: float, e: float | None) -> float:
            return 0.0 if e is None else 1.0 / (rate * e)

        lin_bytes = (m.linear_params + m.lm_head_params) * WEIGHT_BYTES[self.weight_format] / tp
        return (
            per(peak, eff["matmul"]),
            per(peak, eff["attention"]),
            per(bw, eff["memory"]),
            lin_bytes,
            4.0 * m.num_layers * m.num_heads * m.head_dim / tp,
        )

    def terms(self, s: StepShape) -> dict[str, float]:
        """Each term of the step's time, seconds (and their sum, ``"total"``)."""
        m, p, tp = self.model, self.profile, self.tp
        per_lin, per_att, per_byte, lin_bytes, attn_per_pair = self._rates
        lin_flops = (
            2 * m.linear_params * self._rows(s) + 2 * m.lm_head_params * s.num_sampled
        ) / tp
        kv_bytes = self.kv_bytes_per_token * (s.kv_read_tokens + s.num_tokens)
        lin_c, lin_m = lin_flops * per_lin, lin_bytes * per_byte
        att_c, att_m = attn_per_pair * s.attn_pairs * per_att, kv_bytes * per_byte
        if p.combine == "max":
            lin, att = max(lin_c, lin_m), max(att_c, att_m)
        else:
            lin, att = lin_c + lin_m, att_c + att_m
        comm = 0.0
        if tp > 1:
            act = _ACT_BYTES.get(self.dtype, 2) * s.num_tokens * m.hidden_size
            link = p.interconnect_Bps * (p.efficiency["interconnect"] or 1.0)
            comm = 2 * m.num_layers * (p.interconnect_latency_s + 2 * (tp - 1) / tp * act / link)
        fixed = p.overhead_s + p.per_seq_s * s.num_seqs
        if s.num_tokens >= 2:
            fixed += p.multi_token_s
            if p.few_token_s:
                fixed += p.few_token_s.get(str(s.num_tokens), 0.0)
        return {
            "linear": lin,
            "attention": att,
            "communication": comm,
            "fixed": fixed,
            "total": lin + att + comm + fixed,
        }

    def _rows(self, s: StepShape) -> float:
        """Rows the projections are timed at: ``T``, or the profile's knee
        for a step of two or more tokens below it."""
        knee = self.profile.matmul_knee_tokens
        return float(max(s.num_tokens, knee) if s.num_tokens >= 2 else s.num_tokens)

    def __call__(self, s: StepShape) -> float:
        """The step's time, seconds."""
        return self.terms(s)["total"]

    def features(self, s: StepShape) -> list[float]:
        """The fit's regressors under ``combine`` "sum" (one device):
        [1, T >= 2, S, projection FLOPs (at the profile's knee), attention
        FLOPs, KV bytes]; the weights' bytes are the same every step, so they
        sit in the constant."""
        m = self.model
        return [
            1.0,
            1.0 if s.num_tokens >= 2 else 0.0,
            float(s.num_seqs),
            2.0 * m.linear_params * self._rows(s) + 2.0 * m.lm_head_params * s.num_sampled,
            4.0 * m.num_layers * m.num_heads * m.head_dim * s.attn_pairs,
            self.kv_bytes_per_token * (s.kv_read_tokens + s.num_tokens),
        ]
