"""Tensor-parallel workers: ranks 1..N-1 run the same forward pass as rank 0
on their shard, fed by the step arrays rank 0 broadcasts (torch.distributed,
gloo on CPU, nccl on GPU)."""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ..executor.kv_cache import KVCacheSpec
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


def build_runner(
    model_name: str | torch.nn.Module,
    dtype: torch.dtype,
    device: torch.device,
    block_size: int,
    num_blocks: int,
    num_cpu_blocks: int,
    use_triton: bool,
    rank: int,
    world: int,
) -> ModelRunner:
    """Load ``model_name`` (or take a loaded model), keep this rank's shard in
    place, and allocate the shard's KV cache."""
    model = load_model(model_name, dtype, device) if isinstance(model_name, str) else model_name
    kv_heads = shard_llama(model, rank, world)
    full = KVCacheSpec.from_config(model.config, block_size, dtype)
    spec = KVCacheSpec(full.num_layers, kv_heads, full.head_dim, block_size, dtype)
    # Sharded HF modules carry the all-reduces; the native code assumes whole layers.
    return ModelRunner(
        model, spec, num_blocks, device, use_triton, num_cpu_blocks, model_impl="transformers"
    )


def broadcast_step(step: dict[str, np.ndarray] | None) -> dict[str, np.ndarray] | None:
    """Rank 0 sends the step arrays (None: shut down); other ranks receive them."""
    box: list[Any] = [step]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def worker_main(rank: int, world: int, port: int, kwargs: dict[str, Any]) -> None:
    """Entry point of a worker process: serve steps until rank 0 says stop."""
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    device = torch.device(kwargs["device"])
    if device.type == "cuda":  # one GPU per rank (nccl needs distinct devices)
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
    init_group(rank, world, port, device)
    try:
        runner = build_runner(
            kwargs["model"],
            kwargs["dtype"],
            device,
            kwargs["block_size"],
            kwargs["num_blocks"],
            kwargs["num_cpu_blocks"],
            kwargs["use_triton"],
            rank,
            world,
        )
        dist.barrier()
        while True:
            step = broadcast_step(None)
            if step is None:
                break
            runner.apply_block_moves(step)
            if len(step["input_ids"]):
                runner.execute(step)
    finally:
        dist.destroy_process_group()


def start_workers(world: int, port: int, kwargs: dict[str, Any]) -> list[mp.Process]:
    """Spawn ranks 1..world-1 (they load the model and wait for steps)."""
    ctx = mp.get_context("spawn")
    procs = []
    for rank in range(1, world):
        p = ctx.Process(target=worker_main, args=(rank, world, port, kwargs), daemon=True)
        p.start()
        procs.append(p)
    return procs
