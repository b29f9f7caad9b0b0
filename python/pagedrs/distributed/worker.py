"""Tensor-parallel workers: ranks 1..N-1 run the same forward pass as rank 0
on their shard, fed by the messages rank 0 broadcasts (torch.distributed,
gloo on CPU, nccl on GPU): ``("moves", BlockMoves)`` before a step that moves
blocks, ``("execute", StepBatch)`` for each forward pass, ``None`` to stop."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.process import BaseProcess
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import PreTrainedModel

from ..executor.kv_cache import KVCacheGroupSpec, KVCacheSpec
from ..executor.model_loader import load_model
from ..executor.model_runner import ModelRunner
from .sharding import shard_llama

COLLECTIVE_TIMEOUT = timedelta(seconds=120)


def free_port() -> int:
    """A free TCP port on the loopback interface."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def init_group(rank: int, world: int, port: int, device: torch.device) -> None:
    """Join the tensor-parallel process group on 127.0.0.1:``port``."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(
        backend,
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=COLLECTIVE_TIMEOUT,
    )


@dataclass(frozen=True)
class ShardConfig:
    """What every rank builds its shard's ``ModelRunner`` from (rank 0 sends
    it to the workers as they start).

    Args:
        model: what each worker loads (a name or local path).
        dtype, device, block_size, num_blocks, num_cpu_blocks, attention_backend:
            as for ``ModelRunner`` (a worker on CUDA takes the GPU of its rank).
        world: tensor_parallel_size (>= 2).
        kv_cache_groups: the whole model's KV cache groups (every rank
            allocates them for its KV heads; default: one full group).
        kv_cache_dtype: the KV cache dtype setting every rank stores in.
    """

    model: str
    dtype: torch.dtype
    device: torch.device
    block_size: int
    num_blocks: int
    num_cpu_blocks: int
    attention_backend: str
    world: int
    kv_cache_groups: tuple[KVCacheGroupSpec, ...] = ()
    kv_cache_dtype: str = "auto"


def build_runner(
    config: ShardConfig,
    rank: int,
    device: torch.device,
    model: PreTrainedModel | None = None,
) -> ModelRunner:
    """Load ``config.model`` (or take the loaded ``model``) on ``device``, keep
    this rank's shard in place, and allocate the shard's KV cache: rank 0's
    KV cache groups (``config.kv_cache_groups``; default: one full group),
    this rank's KV heads, stored as ``config.kv_cache_dtype``."""
    if model is None:
        model = load_model(config.model, config.dtype, device)
    kv_heads = shard_llama(model, rank, config.world)
    full = KVCacheSpec.from_config(model.config, config.block_size, config.dtype)
    spec = KVCacheSpec(
        full.num_layers,
        kv_heads,
        full.head_dim,
        config.block_size,
        config.dtype,
        tuple(config.kv_cache_groups),
        config.kv_cache_dtype,
    )
    # Sharded HF modules carry the all-reduces; the native code assumes whole layers.
    return ModelRunner(
        model,
        spec,
        config.num_blocks,
        device,
        config.attention_backend,
        config.num_cpu_blocks,
        model_impl="transformers",
    )


def broadcast_message(message: tuple[str, Any] | None) -> tuple[str, Any] | None:
    """Rank 0 sends ``(kind, payload)`` (None: shut down); other ranks receive it."""
    box: list[Any] = [message]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def worker_main(rank: int, port: int, config: ShardConfig) -> None:
    """Entry point of a worker process: serve steps until rank 0 says stop."""
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // config.world))
    device = config.device
    if device.type == "cuda":  # one GPU per rank (nccl needs distinct devices)
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
    init_group(rank, config.world, port, device)
    try:
        runner = build_runner(config, rank, device)
        dist.barrier()
        while True:
            message = broadcast_message(None)
            if message is None:
                break
            kind, payload = message
            if kind == "moves":
                runner.apply_block_moves(payload)
            elif kind == "execute":
                runner.execute(payload)
            else:
                raise RuntimeError(f"unknown tensor-parallel message {kind!r}")
    finally:
        dist.destroy_process_group()


def start_workers(port: int, config: ShardConfig) -> list[BaseProcess]:
    """Spawn ranks 1..world-1 (they load the model and wait for steps)."""
    ctx = mp.get_context("spawn")
    procs: list[BaseProcess] = []
    for rank in range(1, config.world):
        p = ctx.Process(target=worker_main, args=(rank, port, config), daemon=True)
        p.start()
        procs.append(p)
    return procs
