"""The executor interface the engine drives: one implementation runs the model
in this process (``ModelRunner``), one splits it over tensor-parallel ranks
(``distributed.TensorParallelRunner``)."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np
import torch

from .._core import BlockMoves, StepBatch
from .kv_cache import KVCacheSpec


@runtime_checkable
class Executor(Protocol):
    """Runs the scheduler's steps on the model and its paged KV cache."""

    @property
    def kv_cache_spec(self) -> KVCacheSpec:
        """Shape and dtype of the KV cache this executor holds (one rank's
        share under tensor parallelism)."""
        ...

    def apply_block_moves(self, moves: BlockMoves) -> None:
        """Apply a step's block moves before its forward pass, in order:
        swap out (device -> CPU), swap in (CPU -> device), copy-on-write."""
        ...

    def execute(
        self, batch: StepBatch, extra_rows: np.ndarray | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Forward the batch's tokens (``batch.num_tokens > 0``).

        Args:
            batch: the step's model inputs.
            extra_rows: int ``[E]`` more token rows whose logits are wanted
                (prompt logprobs), or None.
        Returns:
            float32 ``[R + D, vocab]`` logits of the sampled rows
            (``batch.spec_logits_indices``: ``batch.logits_indices`` without
            draft tokens; with them, each row's ``num_draft_tokens + 1``
            verified positions), and float32 ``[E, vocab]`` logits of
            ``extra_rows`` (or None).
        """
        ...

    def close(self) -> None:
        """Release workers and resources (idempotent)."""
        ...
