"""KV cache tensors: one key and one value tensor per layer."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PretrainedConfig


@dataclass(frozen=True)
class KVCacheSpec:
    """Shape of the paged KV cache of a model.

    Attributes:
        num_layers: decoder layers.
        num_kv_heads: KV heads per layer (GQA).
        head_dim: channels per head.
        block_size: tokens per block.
        dtype: element type.
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: torch.dtype

    @classmethod
    def from_config(
        cls, config: PretrainedConfig, block_size: int, dtype: torch.dtype
    ) -> KVCacheSpec:
        """Read layer, head and head-dim counts from an HF config."""
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        return cls(
            num_layers=config.num_hidden_layers,
            num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=head_dim,
            block_size=block_size,
            dtype=dtype,
        )

    @property
    def bytes_per_block(self) -> int:
        """Bytes one block takes across all layers, keys and values."""
        elem = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.num_kv_heads * self.block_size * self.head_dim * elem

    def num_blocks(self, kv_cache_memory_bytes: int) -> int:
        """Blocks that fit in a KV budget of ``kv_cache_memory_bytes`` bytes."""
        return kv_cache_memory_bytes // self.bytes_per_block

    def allocate(
        self, num_blocks: int, device: torch.device
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per-layer ``(key_cache, value_cache)``, each ``[num_blocks, Hkv, bs, D]``."""
        shape = (num_blocks, self.num_kv_heads, self.block_size, self.head_dim)
        # Slots past a sequence's length are masked out of the softmax but still
        # multiplied by zero weights, so they must hold finite values. On CPU a
        # per-layer tensor this large is a fresh mmap of zero pages that the OS
        # commits lazily as blocks are first written (torch.zeros would touch
        # the whole budget up front); small ones and GPU tensors are zeroed.
        lazy = device.type == "cpu" and num_blocks * self.bytes_per_block >= 64 << 20
        alloc = torch.empty if lazy else torch.zeros
        return [
            (
                alloc(shape, dtype=self.dtype, device=device),
                alloc(shape, dtype=self.dtype, device=device),
            )
            for _ in range(self.num_layers)
        ]
