"""The CPU backend: the Rust kernels of ``pagedrs._core``.

The torch path gathers every sequence's context into a padded copy before
attending; these kernels read keys and values in place through the block
tables (PagedAttention §4.1), in parallel over (sequence, KV head) on the
OpenMP team torch already runs, so a decode step costs one pass over the
context actually held (under a sliding window, over the window's blocks only).
They take float32 CPU caches (``check``); prefill chunks go through the torch
backend's per-sequence path, with the same window, soft cap and sinks.
"""

from __future__ import annotations

import torch

from ... import _core
from .torch_ref import TorchBackend


class CpuBackend(TorchBackend):
    """Rust paged decode attention and K/V writes on float32 CPU caches."""

    name = "cpu"

    def check(self, dtype: torch.dtype, device: torch.device) -> None:
        """Raises ``ValueError`` unless float32 on CPU."""
        if device.type != "cpu" or dtype != torch.float32:
            raise ValueError(
                "attention_backend='cpu' runs the Rust kernels on float32 CPU KV caches, "
                f"not {dtype} on {device.type}; use attention_backend='torch' or 'auto'"
            )

    def write_kv(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        """As ``AttentionBackend.write_kv``.

        Raises:
            ValueError: inconsistent shapes or a slot outside the cache.
        """
        _core.write_kv(
            key.float().contiguous().numpy(),
            value.float().contiguous().numpy(),
            key_cache.numpy(),
            value_cache.numpy(),
            slot_mapping.to(torch.int64).contiguous().numpy(),
        )

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
        """As ``AttentionBackend.decode`` (float32, contiguous caches).

        Raises:
            ValueError: inconsistent shapes or a block id outside the cache.
        """
        q = query.contiguous()
        out = torch.empty_like(q)
        _core.paged_decode_attention(
            q.numpy(),
            key_cache.numpy(),
            value_cache.numpy(),
            block_tables.to(torch.int32).contiguous().numpy(),
            seq_lens.to(torch.int32).contiguous().numpy(),
            float(scale),
            out.numpy(),
            torch.get_num_threads(),
            sliding_window=sliding_window,
            softcap=softcap,
            sinks=None if sinks is None else sinks.float().contiguous().numpy(),
        )
        return out
