"""A step's token bitmask and applying it to the sampler's logits."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import xgrammar as xgr


@dataclass
class StepBitmask:
    """Allowed next tokens of a step's grammar samples.

    Attributes:
        bitmask: int32 ``[K, ceil(vocab_size / 32)]``, one row per sample of the
            step (``K = sum(num_samples)``, the sampler's expanded rows; in a
            step with drafts, the verify step's position rows' samples, one
            per draft position), bit ``t % 32`` of word ``t // 32`` set when
            token t is allowed; rows without a grammar are all ones.
        rows: the sample rows that have a grammar (ascending).
        vocab_size: tokens the bitmask covers; logits columns past it (padding)
            are masked in grammar rows.
        fill_s: seconds the fill took on its worker thread.
    """

    bitmask: torch.Tensor
    rows: list[int]
    vocab_size: int
    fill_s: float = 0.0


def apply_bitmask(logits: torch.Tensor, mask: StepBitmask) -> None:
    """Set the logits of disallowed tokens to -inf in the grammar rows, in place.

    Args:
        logits: float ``[K, V]`` (any device), one row per sample.
        mask: the step's bitmask; ``mask.bitmask`` has ``K`` rows.
    Raises:
        ValueError: the row counts differ.
    """
    if logits.shape[0] != mask.bitmask.shape[0]:
        raise ValueError(
            f"bitmask has {mask.bitmask.shape[0]} rows for {logits.shape[0]} logits rows"
        )
    bitmask = mask.bitmask.to(logits.device, non_blocking=True)
    width = logits.shape[1]
    vocab = min(width, mask.vocab_size)
    target = logits if logits.is_contiguous() else logits.contiguous()
    xgr.apply_token_bitmask_inplace(target, bitmask, vocab_size=vocab, indices=mask.rows)
    if target is not logits:
        logits.copy_(target)
    if width > vocab:
        logits[torch.tensor(mask.rows, device=logits.device), vocab:] = float("-inf")
