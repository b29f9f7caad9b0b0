"""The plain torch backend: the reference every other backend is tested
against (``attention.torch_ops``); it gathers each context into a padded copy."""

from __future__ import annotations

import torch

from .. import torch_ops
from ..metadata import AttentionMetadata
from ..options import AttentionOptions
from .base import AttentionBackend


class TorchBackend(AttentionBackend):
    """Paged attention with torch operations only (any device and dtype)."""

    name = "torch"

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
        """Decodes in one ``decode`` call, then each prefill chunk on its own:
        a whole prompt attends to its fresh K/V when the cache stores them
        exactly (its dtype is theirs), a later chunk or a prompt over a
        narrower or quantized cache to its gathered, dequantized context (so a
        sequence attends to the same values whether its prefix was cached,
        chunked or not); under a window, only the part some query sees."""
        out = torch.empty_like(query)
        if meta.decode_seqs.numel():
            d = meta.decode_seqs
            out[meta.decode_tokens] = self.decode(
                query[meta.decode_tokens],
                key_cache,
                value_cache,
                meta.block_tables[d],
                meta.seq_lens[d],
                opts,
            )
        for seq, start, end, seq_len in meta.prefills:
            exact = key_cache.dtype == key.dtype and value_cache.dtype == value.dtype
            if seq_len == end - start and exact:
                k_seq, v_seq = key[start:end].transpose(0, 1), value[start:end].transpose(0, 1)
            else:
                table = meta.block_tables[seq : seq + 1]
                k_seq = torch_ops.load_kv(key_cache, table, seq_len, query.dtype)[0]
                v_seq = torch_ops.load_kv(value_cache, table, seq_len, query.dtype)[0]
            if opts.sliding_window is not None:
                # Keys before the first query's window are seen by no query.
                first = max(0, seq_len - (end - start) - opts.sliding_window + 1)
                k_seq, v_seq = k_seq[:, first:], v_seq[:, first:]
            out[start:end] = torch_ops.causal_prefix_attention(
                query[start:end],
                k_seq.to(query.dtype),
                v_seq.to(query.dtype),
                opts.scale,
                **opts.features(),
            )
        return out
