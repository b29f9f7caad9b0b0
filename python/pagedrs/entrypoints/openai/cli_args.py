"""Arguments of ``pagedrs serve`` (kept apart from the server so that the
command line parses without importing FastAPI)."""

from __future__ import annotations

import argparse

from ...engine.arg_utils import EngineArgs
from ...executor.model_registry import DEFAULT_MODEL


def add_serve_args(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``pagedrs serve``."""
    parser.add_argument("model", nargs="?", default=DEFAULT_MODEL, help="alias, HF folder, .gguf")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY'")
    parser.add_argument(
        "--served-model-name", nargs="+", default=None, help="names for 'model' (default MODEL)"
    )
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--max-num-batched-tokens", type=int, default=None)
    parser.add_argument(
        "--max-waiting-requests", type=int, default=1024, help="bound of the queue (503 beyond)"
    )
    parser.add_argument("--kv-cache-memory-bytes", type=int, default=None)
    parser.add_argument("--num-gpu-blocks-override", type=int, default=None)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--tensor-parallel-size", type=int, default=1, help="ranks the model is split over"
    )
    parser.add_argument("--preemption-mode", default="recompute", choices=["recompute", "swap"])
    parser.add_argument(
        "--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True
    )
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=None,
        help="torch intra-op threads (default: one fewer than the cores, at least 1, so "
        "that the HTTP event loop keeps a core: OpenMP threads competing with it for every "
        "core slow steps down many times over)",
    )
    parser.add_argument("--log-level", default="info")


def engine_args(ns: argparse.Namespace) -> EngineArgs:
    """Engine arguments from ``pagedrs serve``'s arguments.

    Raises:
        ValueError: invalid values.
    """
    return EngineArgs(
        model=ns.model,
        dtype=ns.dtype,
        device=ns.device,
        block_size=ns.block_size,
        kv_cache_memory_bytes=ns.kv_cache_memory_bytes,
        num_gpu_blocks_override=ns.num_gpu_blocks_override,
        max_model_len=ns.max_model_len,
        max_num_seqs=ns.max_num_seqs,
        max_num_batched_tokens=ns.max_num_batched_tokens,
        enable_prefix_caching=ns.enable_prefix_caching,
        preemption_mode=ns.preemption_mode,
        seed=ns.seed,
        tensor_parallel_size=ns.tensor_parallel_size,
    )
