"""The attention-backend interface: what every paged attention implementation
provides (PagedAttention §4.1), and the one step structure they share.

Shapes: ``T`` tokens of the step, ``S`` sequences, ``Hq`` / ``Hkv`` query / KV
heads, ``D`` head dim, ``N`` physical blocks, ``bs`` block size, ``B`` block
table width, ``M`` block pairs. Caches are per layer ``[N, Hkv, bs, E]`` in a
KV cache dtype's storage (``attention.kv_cache_dtype``; ``E`` its entry size:
``D``, or ``D + 2`` for int8 with the entry's scale): backends quantize on
``write_kv`` and dequantize as they attend, and move whole entries (values
and scales) in ``copy_blocks`` / ``swap_blocks``.

Every attention call takes the options some models add on top of causal
softmax attention, with HF transformers' eager semantics (see
``attention.torch_ops``): ``sliding_window`` (tokens; the query at position
``p`` sees keys ``p - sliding_window < k <= p``), ``softcap`` (logits become
``tanh(logits / softcap) * softcap`` after scaling) and ``sinks`` (float32
``[Hq]``, a per query head logit that joins each softmax and whose weight is
dropped). None turns each off.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import torch

from .. import torch_ops
from ..kv_cache_dtype import KVCacheDtype
from ..metadata import AttentionMetadata

KVCaches = list[tuple[torch.Tensor, torch.Tensor]]


def check_options(
    num_heads: int,
    sliding_window: int | None,
    softcap: float | None,
    sinks: torch.Tensor | None,
) -> dict[str, Any]:
    """The attention options as keyword arguments, normalized: a window as
    ``int``, a soft cap as ``float``, sinks as float32 ``[Hq]``.

    Raises:
        ValueError: ``sliding_window`` < 1, ``softcap`` <= 0, or ``sinks`` not
            of ``num_heads`` elements.
    """
    if sliding_window is not None:
        sliding_window = int(sliding_window)
        if sliding_window < 1:
            raise ValueError(f"sliding_window must be >= 1, got {sliding_window}")
    if softcap is not None:
        softcap = float(softcap)
        if not softcap > 0:
            raise ValueError(f"softcap must be > 0, got {softcap}")
    if sinks is not None:
        if sinks.numel() != num_heads:
            raise ValueError(
                f"sinks must hold one logit per query head ({num_heads}), "
                f"got shape {tuple(sinks.shape)}"
            )
        sinks = sinks.detach().reshape(num_heads).to(torch.float32)
    return {"sliding_window": sliding_window, "softcap": softcap, "sinks": sinks}


class AttentionBackend(ABC):
    """One paged attention implementation.

    Subclasses implement ``write_kv``, ``decode`` and ``mixed``; ``forward``
    is the per-layer entry point the models call, and ``copy_blocks`` /
    ``swap_blocks`` move whole blocks for copy-on-write and swapping.
    """

    #: The ``attention_backend`` setting that selects this backend.
    name: ClassVar[str]

    @classmethod
    def check(cls, kv_cache_dtype: KVCacheDtype, dtype: torch.dtype, device: torch.device) -> None:
        """Whether this backend runs KV caches of ``kv_cache_dtype`` for a
        model computing in ``dtype`` on ``device`` (the default: all).

        Raises:
            ValueError: it does not; the message names the KV cache dtype,
                the model dtype and the backend.
        """
        return None

    @abstractmethod
    def write_kv(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        """Store the step's new K/V ``[T, Hkv, D]`` at ``slot_mapping`` (int64
        ``[T]``, ``block * bs + offset``; slots < 0 skipped), in place, in the
        caches' format (``kv_cache_dtype.quantize``)."""

    @abstractmethod
    def decode(
        self,
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        scale: float,
        *,
        sliding_window: int | None = None,
        softcap: float | None = None,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One query token per sequence (``[S, Hq, D]``) attending to its
        paged context (int32 ``block_tables`` ``[S, B]``, ``seq_lens`` ``[S]``,
        the query's own token already written): all of it, or its last
        ``sliding_window`` tokens; ``softcap`` and ``sinks`` (float32 ``[Hq]``)
        as in the module docs. Returns ``[S, Hq, D]``."""

    @abstractmethod
    def mixed(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        *,
        sliding_window: int | None = None,
        softcap: float | None = None,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """A step with prefills (chunks of several tokens over a cached prefix)
        and decodes: each sequence's new tokens attend causally to its cached
        prefix and to each other (under ``sliding_window``, each to the last
        ``sliding_window`` tokens up to itself). ``query`` ``[T, Hq, D]``,
        ``key`` / ``value`` ``[T, Hkv, D]`` (already written); ``softcap``,
        ``sinks`` (float32 ``[Hq]``) as in the module docs. Returns
        ``[T, Hq, D]``."""

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        *,
        sliding_window: int | None = None,
        softcap: float | None = None,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One layer's paged attention over a packed step of ``T`` tokens:
        write the new K/V into their slots, then attend through the block
        tables.

        Args:
            query: ``[T, Hq, D]`` after rotary embedding.
            key, value: ``[T, Hkv, D]`` of the step's new tokens.
            key_cache, value_cache: this layer's ``[N, Hkv, bs, E]`` caches.
            meta: the step's metadata.
            scale: softmax scale (the model's, e.g. Gemma's
                ``query_pre_attn_scalar ** -0.5``).
            sliding_window: window in tokens: the query at position ``p``
                sees keys ``p - sliding_window < k <= p``; None: all of
                ``k <= p``.
            softcap: attention logit soft cap: logits become
                ``tanh(logits / softcap) * softcap`` after scaling; None: off.
            sinks: float32 ``[Hq]``, a logit per query head appended to every
                row of scores before the softmax, its weight dropped (gpt-oss);
                None: off.
        Returns:
            ``[T, Hq, D]`` in the query's dtype.
        Raises:
            ValueError: ``sliding_window`` < 1, ``softcap`` <= 0, or ``sinks``
                not of ``Hq`` elements.
        """
        opts = check_options(query.shape[1], sliding_window, softcap, sinks)
        self.write_kv(key, value, key_cache, value_cache, meta.slot_mapping)
        if meta.all_decode:
            return self.decode(
                query, key_cache, value_cache, meta.block_tables, meta.seq_lens, scale, **opts
            )
        return self.mixed(query, key, value, key_cache, value_cache, meta, scale, **opts)

    def copy_blocks(self, kv_caches: KVCaches, block_mapping: torch.Tensor) -> None:
        """Copy-on-write: copy block ``src`` to ``dst`` for each int64
        ``[M, 2]`` row of ``block_mapping``, in every layer's caches."""
        torch_ops.copy_blocks([k for k, _ in kv_caches], [v for _, v in kv_caches], block_mapping)

    def swap_blocks(self, src_caches: KVCaches, dst_caches: KVCaches, pairs: torch.Tensor) -> None:
        """Copy block ``pairs[:, 0]`` of ``src_caches`` to ``pairs[:, 1]`` of
        ``dst_caches`` (device <-> CPU pool, same layout), every layer."""
        src, dst = pairs[:, 0], pairs[:, 1]
        for (sk, sv), (dk, dv) in zip(src_caches, dst_caches, strict=True):
            dk[dst.to(dk.device)] = sk[src.to(sk.device)].to(dk.device)
            dv[dst.to(dv.device)] = sv[src.to(sv.device)].to(dv.device)
