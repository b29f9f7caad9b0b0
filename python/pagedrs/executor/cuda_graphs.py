"""CUDA graphs for decode steps: the model's forward captured once per batch
size bucket at start-up, replayed with the step's inputs copied into static
buffers and padded to the bucket.

A decode step of ``S`` sequences runs the graph of the smallest bucket
``b >= S``. Rows ``S..b`` are padding: token 0 at position 0, slot -1 (the
K/V write skips it), context length 1 over block 0 of the block table
(rows zeroed), so every kernel reads valid memory and the padding rows'
outputs, finite and unused, are cut off. The split count of the Triton decode
kernel depends on shapes only (batch bucket, heads, block-table width), so
one captured launch serves every context length up to ``max_model_len``.

The capture itself goes through a ``GraphCapturer``: ``TorchCudaGraphs``
(``torch.cuda.CUDAGraph`` with one memory pool shared by every bucket) on a
GPU; tests pass a stand-in that replays by calling the forward again, which
exercises the buckets, the static buffers and the padding on CPU.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np
import torch

from .._core import StepBatch
from ..attention.metadata import AttentionMetadata

logger = logging.getLogger(__name__)

#: ``forward(input_ids int64 [b], positions int64 [b], metadata per KV cache
#: group) -> hidden states [b, H]``.
DecodeForward = Callable[[torch.Tensor, torch.Tensor, list[AttentionMetadata]], torch.Tensor]


class Replayable(Protocol):
    """A captured graph."""

    def replay(self) -> None:
        """Run the captured work again on the static buffers."""


class GraphCapturer(Protocol):
    """Captures a forward as a graph."""

    def capture(self, fn: Callable[[], torch.Tensor]) -> tuple[Replayable, torch.Tensor]:
        """Capture ``fn()`` (already warmed up); returns the graph and the static
        output tensor that each replay rewrites."""
        ...


class TorchCudaGraphs:
    """``GraphCapturer`` of ``torch.cuda.CUDAGraph``: every graph shares one
    memory pool (buckets are captured largest first, so the smaller ones
    reuse its blocks)."""

    def __init__(self) -> None:
        self.pool = torch.cuda.graph_pool_handle()

    def capture(self, fn: Callable[[], torch.Tensor]) -> tuple[Replayable, torch.Tensor]:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = fn()
        return graph, out


class EagerReplay:
    """``GraphCapturer`` stand-in for CPU tests and dry runs: "replaying" calls
    the forward again and copies its result into the static output, so
    everything but the graph itself (buckets, static buffers, padding) runs."""

    def __init__(self) -> None:
        self.captured = 0

    def capture(self, fn: Callable[[], torch.Tensor]) -> tuple[Replayable, torch.Tensor]:
        out = fn()
        self.captured += 1
        return _Rerun(fn, out), out


class _Rerun:
    def __init__(self, fn: Callable[[], torch.Tensor], out: torch.Tensor) -> None:
        self.fn, self.out = fn, out

    def replay(self) -> None:
        self.out.copy_(self.fn())


def capture_sizes(max_num_seqs: int) -> list[int]:
    """The batch-size buckets: 1, 2, 4, then every multiple of 8 up to
    ``max_num_seqs``, and ``max_num_seqs`` itself (ascending)."""
    sizes = {s for s in (1, 2, 4) if s <= max_num_seqs}
    sizes.update(range(8, max_num_seqs + 1, 8))
    sizes.add(max_num_seqs)
    return sorted(sizes)


class DecodeGraphs:
    """Decode-step graphs of a model runner.

    Args:
        forward: the runner's forward (``DecodeForward``).
        table_widths: block-table width (blocks) of each KV cache group, the
            most a sequence of ``max_model_len`` tokens needs.
        sizes: batch-size buckets to capture.
        device: where the static buffers live.
    """

    def __init__(
        self,
        forward: DecodeForward,
        table_widths: Sequence[int],
        sizes: Sequence[int],
        device: torch.device,
    ) -> None:
        if not sizes or min(sizes) < 1:
            raise ValueError(f"capture sizes must be >= 1, got {list(sizes)}")
        self.forward = forward
        self.sizes = sorted(set(sizes))
        self.device = device
        self.table_widths = list(table_widths)
        n = self.sizes[-1]
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=device)
        self.positions = torch.zeros(n, dtype=torch.int64, device=device)
        self.seq_lens = torch.ones(n, dtype=torch.int32, device=device)
        self.slot_mapping = [
            torch.full((n,), -1, dtype=torch.int64, device=device) for _ in table_widths
        ]
        self.block_tables = [
            torch.zeros(n, w, dtype=torch.int32, device=device) for w in table_widths
        ]
        self.query_start_loc = torch.arange(n + 1, dtype=torch.int32, device=device)
        self.rows = torch.arange(n, dtype=torch.int64, device=device)
        # Host staging of the step's arrays (pinned on a GPU, so the copies
        # are asynchronous; reused each step: the step's sampled tokens reach
        # the host, a synchronization, before the next step writes here).
        pin = device.type == "cuda"
        self._host: dict[int, torch.Tensor] = {
            id(t): torch.zeros(t.shape, dtype=t.dtype, pin_memory=pin)
            for t in (
                self.input_ids,
                self.positions,
                self.seq_lens,
                *self.slot_mapping,
                *self.block_tables,
            )
        }
        self.graphs: dict[int, tuple[Replayable, torch.Tensor]] = {}
        self.replays: dict[int, int] = {}  # bucket -> replays (statistics, tests)

    @property
    def max_batch(self) -> int:
        """The largest bucket."""
        return self.sizes[-1]

    def metadata(self, b: int) -> list[AttentionMetadata]:
        """Each group's metadata over the first ``b`` rows of the static buffers."""
        return [
            AttentionMetadata(
                slot_mapping=slots[:b],
                block_tables=tables[:b],
                seq_lens=self.seq_lens[:b],
                query_start_loc=self.query_start_loc[: b + 1],
                decode_seqs=self.rows[:b],
                decode_tokens=self.rows[:b],
                prefills=[],
                all_decode=True,
                max_query_len=1,
            )
            for slots, tables in zip(self.slot_mapping, self.block_tables, strict=True)
        ]

    def capture(self, capturer: GraphCapturer, warmup: int = 2) -> None:
        """Capture every bucket, largest first, each after ``warmup`` eager
        runs (which compile the Triton kernels and size the allocator) on the
        padding inputs.

        Raises:
            whatever the capture raises (the caller runs eagerly then).
        """
        for b in reversed(self.sizes):
            meta = self.metadata(b)

            def run(b: int = b, meta: list[AttentionMetadata] = meta) -> torch.Tensor:
                return self.forward(self.input_ids[:b], self.positions[:b], meta)

            for _ in range(warmup):
                run()
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self.graphs[b] = capturer.capture(run)
            self.replays[b] = 0

    def bucket(self, num_seqs: int) -> int | None:
        """The smallest captured bucket holding ``num_seqs`` sequences, or None."""
        for b in self.sizes:
            if b >= num_seqs and b in self.graphs:
                return b
        return None

    def can_run(self, batch: StepBatch) -> bool:
        """Whether the step is a decode step a graph serves: one new token per
        sequence, at most the largest bucket, block tables within the widths."""
        num_seqs = len(batch.seq_lens)
        if batch.num_tokens != num_seqs or self.bucket(num_seqs) is None:
            return False
        if len(batch.kv_groups) != len(self.table_widths):
            return False
        return all(
            g.block_tables.shape[1] <= w
            for g, w in zip(batch.kv_groups, self.table_widths, strict=True)
        )

    def run(self, batch: StepBatch) -> torch.Tensor:
        """Replay the step's bucket with its inputs; returns the hidden states
        ``[S, H]`` (a view of the graph's output, valid until the next replay).
        ``can_run(batch)`` must hold."""
        s = len(batch.seq_lens)
        b = self.bucket(s)
        assert b is not None
        host = self._host
        _fill(self.input_ids, host[id(self.input_ids)], batch.input_ids, s, b, 0)
        _fill(self.positions, host[id(self.positions)], batch.positions, s, b, 0)
        _fill(self.seq_lens, host[id(self.seq_lens)], batch.seq_lens, s, b, 1)
        for group, slots, tables in zip(
            batch.kv_groups, self.slot_mapping, self.block_tables, strict=True
        ):
            _fill(slots, host[id(slots)], group.slot_mapping, s, b, -1)
            # Whole rows (contiguous, one asynchronous copy); the columns past
            # this step's width hold earlier steps' ids, never read.
            staged = host[id(tables)][:s]
            staged[:, : group.block_tables.shape[1]].copy_(torch.from_numpy(group.block_tables))
            tables[:s].copy_(staged, non_blocking=True)
            if b > s:
                tables[s:b].zero_()
        graph, out = self.graphs[b]
        graph.replay()
        self.replays[b] += 1
        return out[:s]


def _fill(
    dst: torch.Tensor, staging: torch.Tensor, src: np.ndarray, s: int, b: int, pad: int
) -> None:
    """``dst[:s] = src`` through the host ``staging`` buffer, ``dst[s:b] = pad``."""
    staging[:s].copy_(torch.from_numpy(src))
    dst[:s].copy_(staging[:s], non_blocking=True)
    if b > s:
        dst[s:b].fill_(pad)


def try_capture(
    forward: DecodeForward,
    table_widths: Sequence[int],
    sizes: Sequence[int],
    device: torch.device,
    capturer: GraphCapturer | None = None,
) -> DecodeGraphs | None:
    """``DecodeGraphs`` with every bucket captured, or None (logged as a
    warning: steps then run eagerly) when a capture fails, e.g. a model
    whose forward synchronizes with the host."""
    graphs = DecodeGraphs(forward, table_widths, sizes, device)
    try:
        graphs.capture(capturer if capturer is not None else TorchCudaGraphs())
    except Exception as exc:  # noqa: BLE001 - any capture failure means eager steps
        logger.warning("CUDA graphs off (capture failed, steps run eagerly): %s", exc)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return None
    logger.info("CUDA graphs: decode steps captured for batch sizes %s", graphs.sizes)
    return graphs


__all__ = [
    "DecodeGraphs",
    "EagerReplay",
    "GraphCapturer",
    "TorchCudaGraphs",
    "capture_sizes",
    "try_capture",
]
