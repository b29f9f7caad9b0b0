"""Capturing the Triton launches of one ``Case``: the real launchers run on
small CPU tensors of the case's shapes with each kernel's launch intercepted,
so the captured arguments (constexprs, ``num_warps``, pointer dtypes, strides)
are exactly the ones a GPU launch passes.

Runtime integers the launchers pass (strides, the window) are specialized by
Triton on divisibility by 16 and on equality to 1: the cases use shapes whose
block-table width (5) and window (4095) are neither, which compiles the
variant with the fewest assumptions."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from .cases import _DTYPES, Case

#: Block-table width of the cases (neither 1 nor a multiple of 16).
_TABLE_WIDTH = 5
#: Sliding window of the cases, tokens (neither 1 nor a multiple of 16).
_WINDOW = 4095


@dataclass(frozen=True)
class Launch:
    """One captured kernel launch: the kernel's name, the case, its grid rank
    and the launch's arguments (tensors as CPU stand-ins)."""

    kernel: str
    case: Case
    args: tuple[Any, ...] = field(compare=False, hash=False)
    kwargs: dict[str, Any] = field(compare=False, hash=False)

    def key(self) -> tuple[Any, ...]:
        """What Triton compiles this launch as: kernel, constexprs, num_warps,
        argument dtypes and integer specializations."""
        spec: list[tuple[Any, ...]] = []
        for a in self.args:
            if isinstance(a, torch.Tensor):
                spec.append((str(a.dtype), a.data_ptr() % 16 == 0))
            elif isinstance(a, int):
                spec.append(("int", a == 1, a % 16 == 0))
            else:
                spec.append((type(a).__name__,))
        kw = tuple(sorted((k, str(v)) for k, v in self.kwargs.items()))
        return (self.kernel, tuple(spec), kw)

    def constexprs(self) -> dict[str, Any]:
        """The launch's keyword arguments (constexprs and ``num_warps``), printable."""
        return {
            k: (v if isinstance(v, (int, float, bool, str)) else str(v))
            for k, v in self.kwargs.items()
        }


def _storage(kv_cache: str) -> torch.dtype:
    from ...attention.kv_cache_dtype import FORMATS

    return FORMATS[kv_cache].storage


@contextlib.contextmanager
def _intercept(
    kernels: dict[str, Any], sink: list[tuple[str, tuple[Any, ...], dict[str, Any]]]
) -> Iterator[None]:
    """Replace each kernel's launch with recording its arguments."""

    def recorder(name: str) -> Any:
        def run(*args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
            sink.append((name, args, kwargs))

        return run

    for name, k in kernels.items():
        k.run = recorder(name)
    try:
        yield
    finally:
        for k in kernels.values():
            del k.run


def _kernels() -> dict[str, Any]:
    """Every Triton kernel of ``pagedrs.kernels``, by name."""
    from ..copy_blocks import _copy_blocks_kernel
    from ..decode_attention import _decode_reduce_kernel, _decode_split_kernel
    from ..prefill_attention import _prefill_kernel
    from ..write_kv import _write_kv_kernel

    return {
        "_decode_split_kernel": _decode_split_kernel,
        "_decode_reduce_kernel": _decode_reduce_kernel,
        "_prefill_kernel": _prefill_kernel,
        "_write_kv_kernel": _write_kv_kernel,
        "_copy_blocks_kernel": _copy_blocks_kernel,
    }


def _check_compiled_mode() -> None:
    from triton.runtime import JITFunction

    if os.environ.get("TRITON_INTERPRET") == "1" or not all(
        isinstance(k, JITFunction) for k in _kernels().values()
    ):
        raise RuntimeError(
            "pagedrs.kernels.aot captures launches of compiled kernels: run it in a process "
            "without TRITON_INTERPRET=1 (compile_all starts such processes)"
        )


def capture_launches(case: Case) -> list[Launch]:
    """The kernel launches of one case: a decode step, a prefill step, a K/V
    write and a block copy, as the launchers make them.

    Raises:
        RuntimeError: in a process whose kernels run in the interpreter.
    """
    _check_compiled_mode()
    from ..copy_blocks import copy_blocks
    from ..decode_attention import paged_decode_attention
    from ..prefill_attention import paged_prefill_attention
    from ..write_kv import write_kv

    kernels = _kernels()
    dtype = _DTYPES[case.model_dtype]
    storage = _storage(case.kv_cache)
    entry = case.head_dim + (2 if storage == torch.int8 else 0)
    hq, hkv, d, bs = case.num_heads, case.num_kv_heads, case.head_dim, case.block_size
    num_blocks = 3
    key_cache = torch.zeros(num_blocks, hkv, bs, entry, dtype=storage)
    value_cache = torch.zeros_like(key_cache)
    tables = torch.zeros(2, _TABLE_WIDTH, dtype=torch.int32)
    seq_lens = torch.full((2,), 3, dtype=torch.int32)
    options: dict[str, Any] = {
        "sliding_window": _WINDOW if case.window else None,
        "softcap": 30.0 if case.softcap else None,
        "sinks": torch.zeros(hq, dtype=torch.float32) if case.sinks else None,
    }
    recorded: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
    with _intercept(kernels, recorded):
        paged_decode_attention(
            torch.zeros(2, hq, d, dtype=dtype),
            key_cache,
            value_cache,
            tables,
            seq_lens,
            d**-0.5,
            num_splits=case.num_splits,
            **options,
        )
        paged_prefill_attention(
            torch.zeros(5, hq, d, dtype=dtype),
            key_cache,
            value_cache,
            tables,
            torch.tensor([0, 2, 5], dtype=torch.int32),
            seq_lens,
            d**-0.5,
            max_query_len=3,
            **options,
        )
        write_kv(
            torch.zeros(5, hkv, d, dtype=dtype),
            torch.zeros(5, hkv, d, dtype=dtype),
            key_cache,
            value_cache,
            torch.arange(5, dtype=torch.int64),
        )
        copy_blocks([key_cache], [value_cache], torch.tensor([[0, 1]], dtype=torch.int64))
    return [Launch(name, case, args, kwargs) for name, args, kwargs in recorded]


def unique_launches(cases: Iterable[Case]) -> list[Launch]:
    """The distinct launches of ``cases`` (first case of each kept)."""
    seen: dict[tuple[Any, ...], Launch] = {}
    for case in cases:
        for launch in capture_launches(case):
            seen.setdefault(launch.key(), launch)
    return list(seen.values())
