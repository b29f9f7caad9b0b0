"""The step cost model of the goodput draft-length policy
(``speculative_config.draft_length_policy = "goodput"``), measured on the
machine at engine start-up: for a few batch sizes ``b``, the seconds of a
decode step of ``b`` sequences of one token and of a verify step of ``b``
sequences of ``k + 1`` tokens, each with the logits of every verified
position and their argmax. The Rust scheduler interpolates the points
(``rust/src/spec_decode/draft_policy.rs``) and keeps, of each proposal, the
drafts that raise the step's expected tokens per second.

The calibration runs model forwards on synthetic batches: every sequence
reads the same first blocks of the pool as its context (``context`` tokens)
and writes nothing (negative slots), so it needs the pool's first blocks
only, before any request. Its figures depend on the machine and its load;
tests give ``draft_step_costs`` instead (or ``draft_length_policy="fixed"``)."""

from __future__ import annotations

import logging
import time

import numpy as np
import torch

from .._core import KVCacheGroupBatch, StepBatch
from ..executor.interface import Executor

logger = logging.getLogger(__name__)

#: Drafts per sequence of the measured verify steps: at most this many, and
#: at most ``CALIBRATION_DRAFT_ROWS // batch`` (at least one), fewer where
#: ``num_speculative_tokens`` is smaller or the token budget does not hold them.
CALIBRATION_DRAFTS = 4

#: Draft rows a measured verify step aims at (large batches verify one draft
#: per sequence: the step's cost per row is what is measured).
CALIBRATION_DRAFT_ROWS = 64

#: Context of every sequence of a measured step, tokens (less where
#: ``max_model_len`` or the pool is shorter).
CALIBRATION_CONTEXT = 128

#: Timed repeats of each step; the fastest counts.
CALIBRATION_REPEATS = 2


def calibration_batch_sizes(max_num_seqs: int) -> list[int]:
    """The measured batch sizes: powers of 4 below ``max_num_seqs``, and
    ``max_num_seqs`` itself (``[1, 4, 16, 64, 256]`` for 256)."""
    sizes = []
    b = 1
    while b < max_num_seqs:
        sizes.append(b)
        b *= 4
    return [*sizes, max_num_seqs]


def synthetic_step(
    batch: int, drafts: int, context: int, block_size: int, num_groups: int
) -> StepBatch:
    """A step of ``batch`` sequences of ``drafts + 1`` tokens each after
    ``context`` tokens, all reading the first ``ceil((context + drafts + 1)
    / block_size)`` blocks and writing nothing (slot -1), with the logits of
    every token row (``spec_logits_indices``) as a verify step has them."""
    q = drafts + 1
    seq_len = context + q
    table = np.arange(-(-seq_len // block_size), dtype=np.int32)
    tokens = batch * q
    positions = np.tile(np.arange(context, seq_len, dtype=np.int64), batch)
    qsl = np.arange(0, tokens + 1, q, dtype=np.int32)
    last = qsl[1:].astype(np.int64) - 1
    return StepBatch(
        input_ids=np.zeros(tokens, np.int64),
        positions=positions,
        query_start_loc=qsl,
        seq_lens=np.full(batch, seq_len, np.int32),
        seq_request_ids=np.arange(batch, dtype=np.uint64),
        kv_groups=[
            KVCacheGroupBatch(np.full(tokens, -1, np.int64), np.tile(table, (batch, 1)))
            for _ in range(num_groups)
        ],
        logits_indices=last,
        sample_request_ids=np.arange(batch, dtype=np.uint64),
        temperature=np.zeros(batch, np.float32),
        top_p=np.ones(batch, np.float32),
        top_k=np.full(batch, -1, np.int32),
        seed=np.full(batch, -1, np.int64),
        num_output_tokens=np.zeros(batch, np.int64),
        num_samples=np.ones(batch, np.int32),
        num_draft_tokens=np.full(batch, drafts, np.int32),
        draft_token_ids=np.zeros(batch * drafts, np.int64),
        spec_logits_indices=np.arange(tokens, dtype=np.int64),
    )


def _time_step(executor: Executor, batch: StepBatch, device: torch.device) -> float:
    """Fastest of ``CALIBRATION_REPEATS`` runs of ``batch``: forward, logits
    and their argmax, seconds."""
    best = float("inf")
    for _ in range(CALIBRATION_REPEATS):
        t0 = time.perf_counter()
        logits, _ = executor.execute(batch)
        logits.argmax(dim=-1)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - t0)
    return best


def measure_draft_step_costs(
    executor: Executor,
    *,
    device: torch.device,
    block_size: int,
    num_blocks: int,
    num_groups: int,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    max_model_len: int,
    num_speculative_tokens: int,
) -> list[tuple[int, float, float]]:
    """Measure the step cost model: ``[batch, decode_s, draft_s]`` points
    for ``draft_step_costs``, one per ``calibration_batch_sizes``.

    ``decode_s`` is the fastest decode step of ``batch`` sequences (at
    least the previous point's: a larger batch is never faster, whatever
    the machine's load did to one timing); ``draft_s`` is the verify step's
    extra time per draft token (``(verify_s - decode_s) / (batch * k)``, at
    least 0), with ``k`` drafts per sequence (``CALIBRATION_DRAFTS`` at
    most, ``CALIBRATION_DRAFT_ROWS // batch`` at most, at least 1) within the
    token budget; a batch whose verify step does not fit the budget takes
    the previous point's ``draft_s``.

    Args:
        executor: the engine's executor, before any request (its pool's
            first blocks are read).
        device: where the model runs (CUDA is synchronized before timing).
        block_size, num_blocks, num_groups: the pool's block size, device
            blocks and KV cache groups.
        max_num_seqs, max_num_batched_tokens, max_model_len: the
            scheduler's limits (batch sizes, tokens per step, context).
        num_speculative_tokens: the configuration's K.
    Returns:
        the points, batch sizes increasing.
    Raises:
        ValueError: a pool or context too small for a step of one token
            after one token of context.
    """
    k_max = min(CALIBRATION_DRAFTS, num_speculative_tokens)
    context = min(
        CALIBRATION_CONTEXT, max_model_len - k_max - 1, num_blocks * block_size - k_max - 1
    )
    if context < 1:
        raise ValueError(
            "speculative_config.draft_step_costs cannot be measured: max_model_len "
            f"{max_model_len} or the pool ({num_blocks} blocks of {block_size}) holds no "
            f"step of {k_max + 1} tokens after a context"
        )
    t_start = time.perf_counter()
    executor.execute(synthetic_step(1, 0, context, block_size, num_groups))  # warm-up
    points: list[tuple[int, float, float]] = []
    for b in calibration_batch_sizes(max_num_seqs):
        if b > max_num_batched_tokens:
            break
        decode_s = _time_step(
            executor, synthetic_step(b, 0, context, block_size, num_groups), device
        )
        if points:
            decode_s = max(decode_s, points[-1][1])
        k = min(k_max, max(1, CALIBRATION_DRAFT_ROWS // b), max_num_batched_tokens // b - 1)
        if k >= 1:
            verify_s = _time_step(
                executor, synthetic_step(b, k, context, block_size, num_groups), device
            )
            draft_s = max(0.0, verify_s - decode_s) / (b * k)
        else:
            draft_s = points[-1][2] if points else 0.0
        points.append((b, decode_s, draft_s))
    logger.info(
        "speculative decoding: step costs measured in %.2f s (context %d tokens): %s",
        time.perf_counter() - t_start,
        context,
        ", ".join(
            f"{b} seqs: decode {1000 * d:.2f} ms, +{1000 * x:.3f} ms/draft" for b, d, x in points
        ),
    )
    return points
