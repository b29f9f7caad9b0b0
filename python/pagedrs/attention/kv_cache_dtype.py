"""KV cache dtypes (vLLM's ``kv_cache_dtype``): how the paged KV cache stores
one token's key or value of one KV head (an *entry*), and the torch reference
of storing (``quantize``) and reading (``dequantize``) entries.

A layer's caches are ``[N, Hkv, bs, E]`` tensors of the format's storage dtype,
``E`` the entry size in storage elements:

============  ===================  ======================  ==========================
name          storage dtype        entry (E)               bytes per entry (D = 64)
============  ===================  ======================  ==========================
float32       float32              ``D`` values            256
float16       float16              ``D`` values            128
bfloat16      bfloat16             ``D`` values            128
fp8_e4m3      float8_e4m3fn        ``D`` values            64
fp8_e5m2      float8_e5m2          ``D`` values            64
int8          int8                 ``D`` values + scale    66
============  ===================  ======================  ==========================

* ``int8``: symmetric per-token, per-head quantization. The entry's last two
  bytes hold its scale as a bfloat16 (little-endian): ``scale =
  bf16(max|x| / 127)``, values ``round_half_even(x / scale)`` clamped to
  ``[-127, 127]`` (all zero when the scale is 0); reading gives ``value *
  scale``. The scale lives inside the entry, so a block's bytes carry their
  own scales: copy-on-write, swapping and prefix caching move blocks whole.
* ``fp8_e4m3`` / ``fp8_e5m2``: a cast with unit scale (vLLM's behaviour for a
  checkpoint without calibrated ``k_scale`` / ``v_scale``), saturating at the
  largest finite value (448 / 57344), rounding to nearest even.
* float dtypes: a cast (round to nearest even).

Quantization always computes in float32 from the model's K/V.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config_values import KV_CACHE_DTYPES

_ALIASES = {"fp8": "fp8_e4m3", "int8_per_token_head": "int8"}

#: Bytes of an int8 entry's scale (one bfloat16).
INT8_SCALE_BYTES = 2

#: Largest finite magnitude of each fp8 storage dtype (writes saturate there).
FP8_MAX = {
    torch.float8_e4m3fn: float(torch.finfo(torch.float8_e4m3fn).max),
    torch.float8_e5m2: float(torch.finfo(torch.float8_e5m2).max),
}


@dataclass(frozen=True)
class KVCacheDtype:
    """One storage format of the paged KV cache.

    Attributes:
        name: canonical name ("float32", "float16", "bfloat16", "fp8_e4m3",
            "fp8_e5m2", "int8").
        storage: element dtype of the cache tensors.
        scale_bytes: bytes of per-entry scale after the values (int8: 2).
    """

    name: str
    storage: torch.dtype
    scale_bytes: int = 0

    def entry_size(self, head_dim: int) -> int:
        """Storage elements per entry: the last dim of the cache tensors."""
        return head_dim + self.scale_bytes // self.storage.itemsize

    def entry_bytes(self, head_dim: int) -> int:
        """Bytes per entry (one token's key or value of one KV head)."""
        return self.entry_size(head_dim) * self.storage.itemsize


FORMATS: dict[str, KVCacheDtype] = {
    f.name: f
    for f in (
        KVCacheDtype("float32", torch.float32),
        KVCacheDtype("float16", torch.float16),
        KVCacheDtype("bfloat16", torch.bfloat16),
        KVCacheDtype("fp8_e4m3", torch.float8_e4m3fn),
        KVCacheDtype("fp8_e5m2", torch.float8_e5m2),
        KVCacheDtype("int8", torch.int8, INT8_SCALE_BYTES),
    )
}

_BY_STORAGE = {f.storage: f for f in FORMATS.values()}
_MODEL_DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def resolve_kv_cache_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> KVCacheDtype:
    """The format of a ``kv_cache_dtype`` setting for a model computing in
    ``model_dtype`` ("auto": the model's dtype).

    Raises:
        ValueError: a name outside ``KV_CACHE_DTYPES``, or "auto" for a
            model dtype no format stores.
    """
    if kv_cache_dtype == "auto":
        name = _MODEL_DTYPES.get(model_dtype)
        if name is None:
            raise ValueError(f"kv_cache_dtype='auto' has no KV cache format for {model_dtype}")
        return FORMATS[name]
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {kv_cache_dtype!r}")
    return FORMATS[_ALIASES.get(kv_cache_dtype, kv_cache_dtype)]


def format_of(cache: torch.Tensor) -> KVCacheDtype:
    """The format of a cache tensor, from its dtype.

    Raises:
        ValueError: a dtype no format stores in.
    """
    try:
        return _BY_STORAGE[cache.dtype]
    except KeyError:
        raise ValueError(f"no KV cache format stores {cache.dtype}") from None


def quantize(x: torch.Tensor, storage: torch.dtype) -> torch.Tensor:
    """Entries of ``x`` (``[..., D]``, any float dtype) in the format stored as
    ``storage``: ``[..., E]`` of ``storage`` (see the module docs)."""
    if storage == torch.int8:
        xf = x.float()
        scale = (xf.abs().amax(dim=-1, keepdim=True) / 127.0).to(torch.bfloat16)
        s = scale.float()
        safe = torch.where(s > 0, s, torch.ones_like(s))
        q = torch.round(xf / safe).clamp_(-127, 127).to(torch.int8)
        return torch.cat([q, scale.view(torch.int8)], dim=-1)
    if storage in FP8_MAX:
        m = FP8_MAX[storage]
        return x.float().clamp(-m, m).to(storage)
    return x.to(storage)


def dequantize(entries: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The values ``[..., D]`` in ``dtype`` of stored entries ``[..., E]``
    (any format; int8 entries through float32: ``value * scale``)."""
    if entries.dtype == torch.int8:
        d = entries.shape[-1] - INT8_SCALE_BYTES
        scale = entries[..., d:].contiguous().view(torch.bfloat16).float()
        return (entries[..., :d].float() * scale).to(dtype)
    return entries.to(dtype)
