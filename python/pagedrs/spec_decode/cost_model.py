"""The step cost model of the goodput draft-length policy
(``speculative_config.draft_length_policy = "goodput"``), measured on the
machine at engine start-up: for a few batch sizes ``b``, the seconds of a
decode step of ``b`` sequences of one token and of a verify step of ``b``
sequences of ``k + 1`` tokens, each with the logits of every verified
position and their argmax. The Rust scheduler interpolates the points
(``rust/pagedrs-sched/src/spec_decode/draft_policy/``) and keeps, of each proposal, the
drafts that raise the step's expected tokens per second.

The calibration runs model forwards on synthetic batches: every sequence
reads the same first blocks of the pool as its context (``context`` tokens)
and writes nothing (negative slots), so it needs the pool's first blocks
only, before any request. The policy's choice depends only on each point's
ratio ``batch * draft_s / decode_s`` (a draft's cost as a share of the
step's), so that ratio is what is measured robustly: decode and verify steps
run in adjacent pairs (the order alternating), and the median over pairs of
the verify / decode ratio counts, so that another process's load, which
slows both steps of a pair alike, cancels. Its figures still depend on the
machine; tests give ``draft_step_costs`` instead (or
``draft_length_policy="fixed"``)."""

from __future__ import annotations

import logging
import statistics
import time

import numpy as np
import torch

from .._core import KVCacheGroupBatch, StepBatch
from ..executor.interface import Executor
from ..executor.sampler import greedy_rows

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

#: Timed (decode, verify) pairs of each batch size; the medians count.
CALIBRATION_PAIRS = 3


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
        **greedy_rows(batch),
        num_draft_tokens=np.full(batch, drafts, np.int32),
        draft_token_ids=np.zeros(batch * drafts, np.int64),
        spec_logits_indices=np.arange(tokens, dtype=np.int64),
    )


def _time_step(executor: Executor, batch: StepBatch, device: torch.device) -> float:
    """Seconds of one run of ``batch``: forward, logits and their argmax."""
    t0 = time.perf_counter()
    logits, _ = executor.execute(batch)
    logits.argmax(dim=-1)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def step_cost_point(
    batch: int,
    drafts: int,
    decode_times: list[float],
    verify_times: list[float],
    previous: tuple[int, float, float] | None,
) -> tuple[int, float, float]:
    """The ``[batch, decode_s, draft_s]`` point of timed pairs of a decode
    step (``decode_times[i]``) and a verify step of ``drafts`` drafts per
    sequence (``verify_times[i]``), run one after the other.

    ``decode_s`` is the median decode time, and at least ``previous``'s (a
    larger batch is never faster). The draft share ``f = batch * draft_s /
    decode_s`` is ``(median(verify / decode) - 1) / drafts`` over the pairs,
    then held between ``previous``'s share and 1: a step's share that grows
    with its tokens only rises with the batch (its fixed part is shared by
    more rows), and a draft row costs no more than the step's mean row.
    Seconds.

    Raises:
        ValueError: no pairs, or lists of different lengths.
    """
    if not decode_times or len(decode_times) != len(verify_times):
        raise ValueError(
            f"step_cost_point needs timed pairs, got {len(decode_times)} decode and "
            f"{len(verify_times)} verify times"
        )
    decode_s = statistics.median(decode_times)
    ratio = statistics.median(v / d for d, v in zip(decode_times, verify_times, strict=True))
    share = max(0.0, ratio - 1.0) / drafts
    if previous is not None:
        prev_batch, prev_decode, prev_draft = previous
        decode_s = max(decode_s, prev_decode)
        share = max(share, prev_batch * prev_draft / prev_decode)
    share = min(share, 1.0)
    return batch, decode_s, share * decode_s / batch


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

    Each point is ``step_cost_point`` of ``CALIBRATION_PAIRS`` adjacent
    pairs of a decode step of ``batch`` sequences and a verify step of ``k``
    drafts per sequence (``CALIBRATION_DRAFTS`` at most,
    ``CALIBRATION_DRAFT_ROWS // batch`` at most, at least 1) within the
    token budget; a batch whose verify step does not fit the budget keeps
    the previous point's draft share (1 for the first point: no drafts).

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
        decode = synthetic_step(b, 0, context, block_size, num_groups)
        k = min(k_max, max(1, CALIBRATION_DRAFT_ROWS // b), max_num_batched_tokens // b - 1)
        if k < 1:  # the verify step does not fit the budget
            decode_s = statistics.median(
                _time_step(executor, decode, device) for _ in range(CALIBRATION_PAIRS)
            )
            share = 1.0
            if points:
                prev_b, prev_decode, prev_draft = points[-1]
                decode_s = max(decode_s, prev_decode)
                share = prev_b * prev_draft / prev_decode
            points.append((b, decode_s, share * decode_s / b))
            continue
        verify = synthetic_step(b, k, context, block_size, num_groups)
        decode_times, verify_times = [], []
        for i in range(CALIBRATION_PAIRS):
            first, second = (decode, verify) if i % 2 == 0 else (verify, decode)
            t_first = _time_step(executor, first, device)
            t_second = _time_step(executor, second, device)
            d, v = (t_first, t_second) if i % 2 == 0 else (t_second, t_first)
            decode_times.append(d)
            verify_times.append(v)
        points.append(
            step_cost_point(b, k, decode_times, verify_times, points[-1] if points else None)
        )
    logger.info(
        "speculative decoding: step costs measured in %.2f s (context %d tokens): %s",
        time.perf_counter() - t_start,
        context,
        ", ".join(
            f"{b} seqs: decode {1000 * d:.2f} ms, +{1000 * x:.3f} ms/draft (share {b * x / d:.2f})"
            for b, d, x in points
        ),
    )
    return points
