"""The elementwise pieces of the native models, each computing what the HF
module it stands for computes (checked bit for bit in
``tests/models/test_native_ops.py``): RMSNorm in its two forms, rotary
embedding by table lookup (full or partial), and the MLP's gate activation.

On CPU, float32 rotary embedding over a half table runs in one pass in the
Rust kernels (``_core.rotate_half``) with the bits of the seven torch calls
it replaces (each allocating its result).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import GELUActivation, GELUTanh, SiLUActivation

import pagedrs._core as _core


class RMSNorm:
    """HF's RMSNorm over the last dim, statistics in float32.

    Two forms: Llama's ``weight * (h * rsqrt(mean(h^2) + eps)).to(x.dtype)``
    with ``h = x.float()`` (Llama, Mistral, Qwen2/3, Phi-3), and Gemma's
    ``(normed * (1 + weight.float())).to(x.dtype)`` (``offset=True``; the
    factor ``1 + w`` computed once here, as HF computes it on each call).
    torch's fused ``F.rms_norm`` computes the float32 part with the same
    bits as HF's formula in fewer passes over memory; for float32 input and
    factor it takes the factor too.

    Args:
        weight: ``[D]``, or ``[H, D]`` for a norm per head applied to all
            heads of ``[T, H, D]`` at once (q/k norms of the fused q/k rows:
            each head's row of ``weight`` is its module's weight).
        eps: the epsilon added to the mean square.
        offset: Gemma's ``1 + weight``.
    """

    def __init__(self, weight: torch.Tensor, eps: float, offset: bool = False) -> None:
        self.eps = float(eps)
        self.offset = offset
        self.dim = int(weight.shape[-1])
        self.factor = 1.0 + weight.detach().float() if offset else weight.detach()
        self._fused = self.factor.dtype == torch.float32 and self.factor.dim() == 1

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` ``[..., D]`` normalized, in its dtype."""
        shape = (self.dim,)
        if x.dtype == torch.float32 and self._fused:
            return F.rms_norm(x, shape, self.factor, self.eps)
        normed = F.rms_norm(x.float(), shape, None, self.eps)
        if self.offset:
            return normed.mul_(self.factor).to(x.dtype)
        return self.factor * normed.to(x.dtype)


def heads_norm(q_norm: Any, k_norm: Any, hq: int, hkv: int, offset: bool) -> RMSNorm:
    """One ``RMSNorm`` over the ``hq + hkv`` heads of the fused q/k rows from
    HF's per-head ``q_norm`` / ``k_norm`` modules (Qwen3, Gemma 3).

    Raises:
        ValueError: the two modules' epsilons differ.
    """
    eps = {float(_eps(q_norm)), float(_eps(k_norm))}
    if len(eps) != 1:
        raise ValueError(f"q_norm and k_norm with different epsilons {sorted(eps)}")
    qw, kw = q_norm.weight.detach(), k_norm.weight.detach()
    weight = torch.cat([qw.expand(hq, -1), kw.expand(hkv, -1)])
    return RMSNorm(weight, eps.pop(), offset)


def norm_of(module: Any, offset: bool = False) -> RMSNorm:
    """An HF RMSNorm module (its ``weight`` and ``variance_epsilon`` or ``eps``)."""
    return RMSNorm(module.weight, _eps(module), offset)


def _eps(module: Any) -> float:
    eps = getattr(module, "variance_epsilon", None)
    return float(eps if eps is not None else module.eps)


class RotaryTable:
    """``cos`` / ``sin`` of every position up to ``max_positions``, from an
    HF rotary module (so every rope type it computes, with its attention
    scaling, is honoured), for rotation by lookup.

    The rotated width ``R`` is the table's (less than the head dim for
    partial rotary: the channels past ``R`` pass unchanged, as HF's Phi-3).
    HF's tables repeat one half (``cat(freqs, freqs)``): then only that half
    is kept, and ``rotate`` computes ``[x1 c - x2 s, x2 c + x1 s]``, HF's
    ``x * cos + rotate_half(x) * sin`` with the same bits (a negated product
    added is the product subtracted); a table of two different halves is
    kept whole and rotated with HF's formula.

    Args:
        rotary: HF's rotary module.
        max_positions: table length (tokens).
        dtype, device: the model's (HF's tables are cast to the hidden
            states' dtype).
        args: what the module takes after ``(x, position_ids)`` (Gemma 3's
            layer type).
    """

    def __init__(
        self,
        rotary: nn.Module,
        max_positions: int,
        dtype: torch.dtype,
        device: torch.device,
        *args: str,
    ) -> None:
        positions = torch.arange(max_positions, device=device)[None]
        probe = torch.zeros(1, dtype=dtype, device=device)
        with torch.no_grad():
            cos, sin = rotary(probe, positions, *args)
        cos, sin = cos[0], sin[0]
        self.width = int(cos.shape[-1])
        h = self.width // 2
        self.half = bool(
            torch.equal(cos[:, :h], cos[:, h:]) and torch.equal(sin[:, :h], sin[:, h:])
        )
        if self.half:
            cos, sin = cos[:, :h], sin[:, :h]
        self.cos, self.sin = cos.contiguous(), sin.contiguous()

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``cos``, ``sin`` ``[T, 1, R or R/2]`` of int64 ``positions`` ``[T]``."""
        return self.cos[positions][:, None], self.sin[positions][:, None]

    def rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """``x`` ``[T, H, D]`` rotated (a new tensor), ``cos`` / ``sin`` from
        ``lookup``."""
        r, h = self.width, self.width // 2
        if self.half and _rust_rows(x, cos, sin):
            return _rotate_half_rows(x, cos, sin, r)
        if not self.half:
            xr = x[..., :r]
            rotated = torch.cat((-xr[..., h:], xr[..., :h]), dim=-1)
            y = xr * cos + rotated * sin
            return y if r == x.shape[-1] else torch.cat((y, x[..., r:]), dim=-1)
        x1, x2 = x[..., :h], x[..., h:r]
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        torch.mul(x1, cos, out=out[..., :h]).sub_(x2 * sin)
        torch.mul(x2, cos, out=out[..., h:r]).add_(x1 * sin)
        if r < x.shape[-1]:
            out[..., r:] = x[..., r:]
        return out


def _rust_rows(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """Whether ``_core.rotate_half`` takes ``x`` ``[T, H, D]``: float32 on
    CPU, each row's heads one after the other (rows at any stride), and a
    float32 table."""
    return (
        x.device.type == "cpu"
        and x.dtype == torch.float32
        and cos.dtype == torch.float32
        and sin.dtype == torch.float32
        and x.dim() == 3
        and x.stride(2) == 1
        and x.stride(1) == x.shape[2]
        and x.stride(0) >= x.shape[1] * x.shape[2]
    )


def _rotate_half_rows(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rot: int
) -> torch.Tensor:
    """``RotaryTable.rotate`` of a half table in one pass (``_core.rotate_half``)."""
    t, heads, dim = x.shape
    out = torch.empty(x.shape, dtype=x.dtype)
    if t == 0 or heads == 0:
        return out
    span = x.as_strided(((t - 1) * x.stride(0) + heads * dim,), (1,))
    _core.rotate_half(
        span.numpy(),
        x.stride(0),
        cos.reshape(-1).contiguous().numpy(),
        sin.reshape(-1).contiguous().numpy(),
        heads,
        dim,
        rot,
        out.view(-1).numpy(),
        torch.get_num_threads(),
    )
    return out


def gate_activation(act: nn.Module) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """The torch function HF's activation module ``act`` computes, or None
    for one the native models do not run: SiLU, GELU (erf) and GELU's tanh
    approximation as torch computes them (not transformers' Python
    formulas, whose bits differ)."""
    if isinstance(act, (SiLUActivation, nn.SiLU)):
        return F.silu
    if isinstance(act, (GELUTanh, GELUActivation)):
        fn = act.act
        if fn is F.gelu:
            return F.gelu
        if isinstance(fn, functools.partial) and fn.func is F.gelu and not fn.args:
            if fn.keywords == {"approximate": "tanh"}:
                return fn
    return None
