"""The attention-backend interface: what every paged attention implementation
provides (PagedAttention §4.1), and the one step structure they share.

Shapes: ``T`` tokens of the step, ``S`` sequences, ``Hq`` / ``Hkv`` query / KV
heads, ``D`` head dim, ``N`` physical blocks, ``bs`` block size, ``B`` block
table width, ``M`` block pairs. Caches are per layer ``[N, Hkv, bs, E]`` in a
KV cache dtype's storage (``attention.kv_cache_dtype``; ``E`` its entry size:
``D``, or ``D + 2`` for int8 with the entry's scale): backends quantize on
``write_kv`` and dequantize as they attend, and move whole entries (values
and scales) in ``copy_blocks`` / ``swap_blocks``.

Every attention call takes the layer's ``AttentionOptions`` (scale, sliding
window, soft cap, sinks: ``attention.options``).

A backend runs a module of paged operations (``ops``): ``write_kv``,
``paged_decode_attention``, ``paged_prefill_attention`` and ``copy_blocks``,
each with the arguments of its reference in ``attention.torch_ops``
(``pagedrs.kernels`` is the Triton one). This class runs a step through them;
a backend overrides a method only where it runs that part its own way.
"""

from __future__ import annotations

from types import ModuleType
from typing import ClassVar

import torch

from .. import torch_ops
from ..kv_cache_dtype import KVCacheDtype
from ..metadata import AttentionMetadata
from ..options import AttentionOptions

KVCaches = list[tuple[torch.Tensor, torch.Tensor]]


class AttentionBackend:
    """One paged attention implementation over the paged operations ``ops``
    (see the module docs).

    ``forward`` is the per-layer entry point the models call: ``write_kv``,
    then ``decode`` (a step of decodes only) or ``mixed`` (a step with
    prefills); ``copy_blocks`` / ``swap_blocks`` move whole blocks for
    copy-on-write and swapping.
    """

    #: The ``attention_backend`` setting that selects this backend.
    name: ClassVar[str]

    def __init__(self, ops: ModuleType = torch_ops) -> None:
        #: The module of paged operations this backend runs.
        self.ops = ops

    @classmethod
    def check(cls, kv_cache_dtype: KVCacheDtype, dtype: torch.dtype, device: torch.device) -> None:
        """Whether this backend runs KV caches of ``kv_cache_dtype`` for a
        model computing in ``dtype`` on ``device`` (the default: all).

        Raises:
            ValueError: it does not; the message names the KV cache dtype,
                the model dtype and the backend.
        """
        return None

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
        self.ops.write_kv(key, value, key_cache, value_cache, slot_mapping)

    def decode(
        self,
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        opts: AttentionOptions,
    ) -> torch.Tensor:
        """One query token per sequence (``[S, Hq, D]``) attending to its
        paged context (int32 ``block_tables`` ``[S, B]``, ``seq_lens`` ``[S]``,
        the query's own token already written): all of it, or its last
        ``opts.sliding_window`` tokens. Returns ``[S, Hq, D]``."""
        return self.ops.paged_decode_attention(
            query, key_cache, value_cache, block_tables, seq_lens, opts.scale, **opts.features()
        )

    def mixed(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        meta: AttentionMetadata,
        opts: AttentionOptions,
    ) -> torch.Tensor:
        """A step with prefills (chunks of several tokens over a cached prefix)
        and decodes: each sequence's new tokens attend causally to its cached
        prefix and to each other (under ``sliding_window``, each to the last
        ``opts.sliding_window`` tokens up to itself). ``query`` ``[T, Hq, D]``,
        ``key`` / ``value`` ``[T, Hkv, D]`` (already written). Returns
        ``[T, Hq, D]``.

        Here one ``paged_prefill_attention`` call runs the whole step, a
        decode as a one-token prefill."""
        return self.ops.paged_prefill_attention(
            query,
            key_cache,
            value_cache,
            meta.block_tables,
            meta.query_start_loc,
            meta.seq_lens,
            opts.scale,
            max_query_len=meta.max_query_len,
            **opts.features(),
        )

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        meta: AttentionMetadata,
        opts: AttentionOptions,
    ) -> torch.Tensor:
        """One layer's paged attention over a packed step of ``T`` tokens:
        write the new K/V into their slots, then attend through the block
        tables.

        Args:
            query: ``[T, Hq, D]`` after rotary embedding.
            key, value: ``[T, Hkv, D]`` of the step's new tokens.
            key_cache, value_cache: this layer's ``[N, Hkv, bs, E]`` caches.
            meta: the step's metadata.
            opts: the layer's scale, sliding window, soft cap and sinks.
        Returns:
            ``[T, Hq, D]`` in the query's dtype.
        Raises:
            ValueError: ``opts.sinks`` not of ``Hq`` elements.
        """
        opts.check_heads(query.shape[1])
        self.write_kv(key, value, key_cache, value_cache, meta.slot_mapping)
        if meta.all_decode:
            return self.decode(
                query, key_cache, value_cache, meta.block_tables, meta.seq_lens, opts
            )
        return self.mixed(query, key, value, key_cache, value_cache, meta, opts)

    def copy_blocks(self, kv_caches: KVCaches, block_mapping: torch.Tensor) -> None:
        """Copy-on-write: copy block ``src`` to ``dst`` for each int64
        ``[M, 2]`` row of ``block_mapping``, in every layer's caches."""
        self.ops.copy_blocks([k for k, _ in kv_caches], [v for _, v in kv_caches], block_mapping)

    def swap_blocks(self, src_caches: KVCaches, dst_caches: KVCaches, pairs: torch.Tensor) -> None:
        """Copy block ``pairs[:, 0]`` of ``src_caches`` to ``pairs[:, 1]`` of
        ``dst_caches`` (device <-> CPU pool, same layout), every layer."""
        src, dst = pairs[:, 0], pairs[:, 1]
        for (sk, sv), (dk, dv) in zip(src_caches, dst_caches, strict=True):
            dk[dst.to(dk.device)] = sk[src.to(sk.device)].to(dk.device)
            dv[dst.to(dv.device)] = sv[src.to(sv.device)].to(dv.device)
