"""Rank 0's executor under tensor parallelism: sends each block move and each
forward pass to the workers, then runs its own shard; the same block tables
serve every rank."""

from __future__ import annotations

from multiprocessing.process import BaseProcess

import numpy as np
import torch
import torch.distributed as dist
from transformers import PreTrainedModel

from .._core import BlockMoves, StepBatch
from ..executor.kv_cache import KVCacheSpec
from .errors import WorkerDiedError
from .worker import (
    ShardConfig,
    broadcast_message,
    build_runner,
    free_port,
    init_group,
    start_workers,
)


class TensorParallelRunner:
    """The ``Executor`` on rank 0 with ``world - 1`` worker processes.

    Args:
        model: rank 0's loaded model, sharded in place.
        config: what every rank builds its shard from (the workers load
            ``config.model``).
    Raises:
        ValueError: a model that cannot be split ``config.world`` ways.
        WorkerDiedError: a worker failed while starting.
    """

    def __init__(self, model: PreTrainedModel, config: ShardConfig) -> None:
        port = free_port()
        self.procs: list[BaseProcess] = start_workers(port, config)
        self.closed = False
        try:
            init_group(0, config.world, port, config.device)
        except Exception as exc:  # a worker never joined (it died while starting)
            self.close(graceful=False)
            raise WorkerDiedError(f"tensor-parallel workers did not start: {exc}") from exc
        try:
            self.local = build_runner(config, 0, config.device, model)
            self._check_workers()
            dist.barrier()
        except BaseException:
            self.close(graceful=False)
            raise
        self.kv_caches = self.local.kv_caches
        self.device = config.device

    def _check_workers(self) -> None:
        for rank, p in enumerate(self.procs, start=1):
            if not p.is_alive():
                self.close(graceful=False)
                raise WorkerDiedError(
                    f"tensor-parallel worker {rank} died (exit code {p.exitcode})"
                )

    @property
    def kv_cache_spec(self) -> KVCacheSpec:
        """Rank 0's share of the KV cache (its KV heads)."""
        return self.local.spec

    def _send(self, kind: str, payload: BlockMoves | StepBatch) -> None:
        self._check_workers()
        try:
            broadcast_message((kind, payload))
        except RuntimeError as exc:
            self.close(graceful=False)
            raise WorkerDiedError(f"a tensor-parallel worker is gone: {exc}") from exc

    def apply_block_moves(self, moves: BlockMoves) -> None:
        """Send the moves to every worker, then apply them to rank 0's shard."""
        self._send("moves", moves)
        self.local.apply_block_moves(moves)

    def execute(
        self, batch: StepBatch, extra_rows: np.ndarray | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Send the batch to every worker, then run rank 0's forward pass (the
        workers run theirs in lockstep; their all-reduces join rank 0's)."""
        self._send("execute", batch)
        try:
            return self.local.execute(batch, extra_rows)
        except RuntimeError as exc:
            if any(not p.is_alive() for p in self.procs):
                self.close(graceful=False)
                raise WorkerDiedError(f"a tensor-parallel worker died: {exc}") from exc
            raise

    def close(self, graceful: bool = True) -> None:
        """Stop the workers and leave the process group (idempotent). Graceful:
        tell the workers to stop; else (a worker died, or start-up failed) kill them."""
        if self.closed:
            return
        self.closed = True
        if graceful and all(p.is_alive() for p in self.procs):
            try:
                broadcast_message(None)
            except RuntimeError:
                pass
        for p in self.procs:
            p.join(timeout=10 if graceful else 0)
            if p.is_alive():
                p.kill()
                p.join(timeout=10)
        if dist.is_initialized():
            dist.destroy_process_group()
