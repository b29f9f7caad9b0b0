"""KV cache formats in the Triton kernels: how ``write_kv`` stores an entry
and how the attention kernels read int8 entries, matching the torch reference
(``pagedrs.attention.kv_cache_dtype``) bit for bit.

Stores round to nearest even with integer operations rather than Triton's
float casts, whose rounding the interpreter does not honour (it truncates);
divisions are ``div_rn`` (IEEE), so the bits are the same on a GPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

#: ``write_kv``'s ``FORMAT``: a plain cast (float32 / float16 caches), bfloat16
#: bits, int8 entries with their scale, fp8 e4m3 / e5m2 bits.
CAST, BF16, INT8, FP8_E4M3, FP8_E5M2 = 0, 1, 2, 3, 4

#: 1.5 * 2^23: adding and subtracting it rounds a float32 of magnitude < 2^22
#: to an integer, ties to even.
_ROUND = tl.constexpr(12582912.0)


def store_format(cache: torch.Tensor) -> tuple[int, torch.Tensor]:
    """(``FORMAT``, the tensor ``write_kv`` stores through) for a cache: its
    element bits for bfloat16 (uint16) and fp8 (uint8), itself otherwise."""
    if cache.dtype == torch.bfloat16:
        return BF16, cache.view(torch.uint16)
    if cache.dtype == torch.int8:
        return INT8, cache
    if cache.dtype == torch.float8_e4m3fn:
        return FP8_E4M3, cache.view(torch.uint8)
    if cache.dtype == torch.float8_e5m2:
        return FP8_E5M2, cache.view(torch.uint8)
    return CAST, cache


@triton.jit
def round_even(x):  # type: ignore[no-untyped-def]  # Triton JIT: typed at launch
    """``x`` (float32, ``|x| < 2^22``) rounded to an integer, ties to even."""
    return (x + _ROUND) - _ROUND


@triton.jit
def bf16_bits(x):  # type: ignore[no-untyped-def]  # Triton JIT: typed at launch
    """float32 ``x`` to bfloat16 bits (uint32), nearest even (no NaN inputs)."""
    bits = x.to(tl.uint32, bitcast=True)
    return (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16


@triton.jit
def fp8_bits(x, MAN: tl.constexpr, BIAS: tl.constexpr, MAX: tl.constexpr):  # type: ignore[no-untyped-def]  # Triton JIT: typed at launch
    """float32 ``x`` clamped to ``[-MAX, MAX]`` and rounded to the nearest fp8
    code (``MAN`` mantissa bits, exponent ``BIAS``), ties to even (uint32)."""
    sign = (x.to(tl.uint32, bitcast=True) >> 24) & 0x80
    a = tl.minimum(tl.abs(x), MAX)
    # Subnormal codes: whole units of 2^(1 - BIAS - MAN) (exact scaling).
    sub = round_even(a * tl.exp2((BIAS - 1 + MAN) * 1.0)).to(tl.uint32)
    bits = a.to(tl.uint32, bitcast=True)
    shift: tl.constexpr = 23 - MAN
    rounded = bits + ((1 << (shift - 1)) - 1) + ((bits >> shift) & 1)
    normal = (rounded >> shift) - ((127 - BIAS) << MAN)
    min_normal = tl.exp2((1 - BIAS) * 1.0)
    return sign | tl.where(a < min_normal, sub, normal)


@triton.jit
def int8_entries(x, mask):  # type: ignore[no-untyped-def]  # Triton JIT: typed at launch
    """float32 ``x`` ``[R, DIM_PAD]`` (``mask``: its real values) as int8
    entries: the quantized values ``[R, DIM_PAD]`` and each row's scale as
    bfloat16 bits ``[R]`` (uint16)."""
    absmax = tl.max(tl.where(mask, tl.abs(x), 0.0), axis=1)
    s_bits = bf16_bits(tl.math.div_rn(absmax, tl.full(absmax.shape, 127.0, tl.float32)))
    s = (s_bits << 16).to(tl.float32, bitcast=True)
    safe = tl.where(s > 0.0, s, 1.0)
    y = round_even(tl.math.div_rn(x, tl.broadcast_to(safe[:, None], x.shape)))
    q = tl.minimum(tl.maximum(y, -127.0), 127.0).to(tl.int8)
    return q, s_bits.to(tl.uint16)
