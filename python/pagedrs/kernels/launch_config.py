"""Launch configuration of the Triton attention kernels: the dtype their
dots run in, tiles, warps, pipeline stages and the register limit per head
dim and dtype (chosen so that ptxas spills no register on sm_80 and sm_90,
checked by ``pagedrs.kernels.aot``), and the decode kernel's context split
count (flash-decoding)."""

from __future__ import annotations

import os

import torch
import triton

#: Most context splits of one (sequence, KV head).
MAX_SPLITS = 32
#: Fewest context tokens worth a split of their own.
MIN_SPLIT_TOKENS = 256


def compute_dtype(query: torch.Tensor, cache_dtype: torch.dtype) -> torch.dtype:
    """The dtype both dots run in: the query's 16-bit dtype when every cache
    element converts to it exactly, else float32. Under ``TRITON_INTERPRET=1``
    bfloat16 dots run in float32 (the interpreter's bfloat16 ``tl.dot``
    returns garbage; float16 ones are right)."""
    if query.dtype not in (torch.float16, torch.bfloat16):
        return torch.float32
    if query.dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1":
        return torch.float32
    exact = {query.dtype, torch.int8, torch.float8_e4m3fn, torch.float8_e5m2}
    return query.dtype if cache_dtype in exact else torch.float32


#: Registers per thread the attention kernels may use (the hardware's most):
#: left to itself ptxas caps a kernel at an occupancy step (168 registers at
#: 4 warps, 128 at 8) and spills the rest.
MAX_REGISTERS = 255


def decode_config(
    compute: torch.dtype, kv_int8: bool, dim_pad: int
) -> tuple[int, int, int, int | None]:
    """``(BLOCK_N, num_warps, num_stages, maxnreg)`` of the split kernel:
    context tokens per loop iteration, warps, software-pipeline stages and
    the register limit (None: ptxas's own), chosen so that ptxas spills no
    register on sm_80 and sm_90 for any launch of ``pagedrs.kernels.aot``
    (``benches/triton_aot.py``).

    - exact fp32 dots (``compute`` float32; FMA in registers): one stage (a
      pipelined loop holds the next tiles' K/V, converted to fp32, in
      registers: 255 registers and 300+ spilled bytes at head dim 128 with
      bfloat16 or fp8 caches); 32 tokens under ptxas's own limit up to head
      dim 128 (``MAX_REGISTERS`` there schedules into 255 registers and
      spills on sm_90), 16 tokens and ``MAX_REGISTERS`` above.
    - 16-bit tensor-core dots: three stages, ``MAX_REGISTERS``; 64 tokens,
      32 for int8 entries (their scales) or above head dim 128, 16 for int8
      entries above head dim 128.

    ``dim_pad`` is the head dim rounded up to a power of two.
    """
    if compute == torch.float32:
        return (32, 4, 1, None) if dim_pad <= 128 else (16, 4, 1, MAX_REGISTERS)
    if kv_int8 and dim_pad > 128:
        return 16, 4, 3, MAX_REGISTERS
    return (32 if kv_int8 or dim_pad > 128 else 64), 4, 3, MAX_REGISTERS


def default_num_splits(
    num_seqs: int, num_kv_heads: int, max_context: int, device: torch.device
) -> int:
    """Context splits for a launch of ``num_seqs * num_kv_heads`` programs: on a
    GPU enough to give each multiprocessor about two programs, at most
    ``MAX_SPLITS`` and at most one per ``MIN_SPLIT_TOKENS`` of ``max_context``
    (the block table's capacity, tokens), a power of two; 1 on CPU.
    Depends on shapes only (CUDA-graph safe)."""
    if device.type != "cuda":
        return 1
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    want = triton.cdiv(2 * sms, max(1, num_seqs * num_kv_heads))
    cap = max(1, max_context // MIN_SPLIT_TOKENS)
    return min(triton.next_power_of_2(max(1, min(want, cap))), MAX_SPLITS)


def prefill_config(dtype: torch.dtype, dim_pad: int) -> tuple[int, int, int, int]:
    """``(BLOCK_M, BLOCK_N, num_warps, num_stages)`` for queries of ``dtype``
    and the head dim rounded up to a power of two (``dim_pad``), chosen (with
    ``MAX_REGISTERS``) so that ptxas spills no register on sm_80 and sm_90
    for any launch of ``pagedrs.kernels.aot`` (``benches/triton_aot.py``).

    The per-key block table gather keeps a pointer per key row live, hence
    the modest ``BLOCK_N``. fp32 queries take exact (FMA, non-tensor-core)
    dots: 16 rows, 32 keys (16 above head dim 128) and one stage (a
    pipelined loop holds the next tiles' K/V, converted to fp32, in
    registers). 16-bit queries pipeline over two stages (three spill at
    head dim 96 on sm_80).
    """
    if dtype == torch.float32:
        return 16, 32 if dim_pad <= 128 else 16, 8 if dim_pad >= 64 else 4, 1
    if dim_pad > 128:
        return 32, 16, 8, 2
    return 64, 64 if dim_pad <= 64 else 32, 8 if dim_pad >= 64 else 4, 2
