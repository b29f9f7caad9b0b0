"""Compiling captured launches for a ``GPUTarget`` without a GPU, as
``JITFunction.run`` would on that GPU (Triton's own argument specialization,
``create_function_from_signature`` and ``_pack_args``), and reading registers,
spill bytes and the stack frame from the wheel's ``ptxas -v`` log.

Compilation needs ``TRITON_INTERPRET`` unset when triton is first imported:
``compile_all`` runs in fresh processes whose environment lacks it."""

from __future__ import annotations

import contextlib
import io
import itertools
import multiprocessing
import os
import re
import tempfile
import time
from collections.abc import Iterable
from dataclasses import asdict
from typing import Any

from .capture import Launch, _kernels, unique_launches
from .cases import CASE_SETS, min_capability

#: CUDA compute capabilities compiled for: A100 (sm_80) and H100 / H200 (sm_90).
CAPABILITIES: tuple[int, ...] = (80, 90)
#: Attention kernels whose compiled code must not spill registers.
NO_SPILL_KERNELS: tuple[str, ...] = (
    "_decode_split_kernel",
    "_decode_reduce_kernel",
    "_prefill_kernel",
)

_PTXAS_FUNC = re.compile(r"Compiling entry function '(\w+)'")
_PTXAS_STACK = re.compile(
    r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads"
)
_PTXAS_REGS = re.compile(r"Used (\d+) registers")


def parse_ptxas_log(log: str) -> dict[str, int]:
    """Registers, stack frame and spill bytes from a ``ptxas -v`` log.

    Raises:
        ValueError: the log lacks them.
    """
    stack = _PTXAS_STACK.search(log)
    regs = _PTXAS_REGS.search(log)
    if stack is None or regs is None:
        raise ValueError(f"no register / spill figures in the ptxas log:\n{log}")
    return {
        "registers": int(regs.group(1)),
        "stack_bytes": int(stack.group(1)),
        "spill_stores": int(stack.group(2)),
        "spill_loads": int(stack.group(3)),
    }


def compile_launch(launch: Launch, capability: int) -> dict[str, Any]:
    """Compile one launch for ``sm_<capability>`` as ``JITFunction.run`` would
    on that GPU.

    Returns:
        ``kernel``, ``arch``, ``case`` (``Case`` fields), ``constexprs``,
        ``ok``; when ``ok``: ``shared_bytes`` (static shared memory),
        ``registers`` per thread, ``spill_stores`` / ``spill_loads`` /
        ``stack_bytes`` (ptxas), ``seconds``; else ``error`` (first lines).
    """
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    fn = _kernels()[launch.kernel]
    result: dict[str, Any] = {
        "kernel": launch.kernel,
        "arch": f"sm_{capability}",
        "case": asdict(launch.case),
        "constexprs": launch.constexprs(),
    }
    target = GPUTarget("cuda", capability, 32)
    backend = make_backend(target)
    kwargs = dict(launch.kwargs)
    kwargs.update(debug=False, instrumentation_mode="", fpsan_homomorphic_casts=False)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    start = time.perf_counter()
    log = io.StringIO()
    try:
        bound, specialization, options = binder(*launch.args, **kwargs)
        options, signature, constexprs, attrs = fn._pack_args(
            backend, kwargs, bound, specialization, options
        )
        knobs.nvidia.dump_ptxas_log = True
        with contextlib.redirect_stdout(log):
            compiled = triton.compile(
                ASTSource(fn, signature, constexprs, attrs), target=target, options=options.__dict__
            )
    except Exception as e:  # noqa: BLE001 - every compile error is a result
        text = f"{type(e).__name__}: {e}"
        result.update(ok=False, error="\n".join(text.splitlines()[:12]))
        return result
    result.update(
        ok=True, shared_bytes=int(compiled.metadata.shared), **parse_ptxas_log(log.getvalue())
    )
    result["seconds"] = round(time.perf_counter() - start, 2)
    return result


def _worker(job: tuple[str, int, int, list[int]]) -> list[dict[str, Any]]:
    """In a fresh process: capture the launches of the named case set and
    compile the ``index``-th of every ``stride`` (launch, capability) pairs."""
    which, index, stride, capabilities = job
    cases = CASE_SETS[which]()
    jobs = [
        (launch, cap)
        for launch, cap in itertools.product(unique_launches(cases), capabilities)
        if cap >= min_capability(launch.case.kv_cache)
    ]
    return [compile_launch(launch, cap) for launch, cap in jobs[index::stride]]


def compile_all(
    which: str = "ci", capabilities: Iterable[int] = CAPABILITIES, processes: int | None = None
) -> list[dict[str, Any]]:
    """Compile every distinct launch of ``full_cases`` (``which="full"``) or
    ``ci_cases`` (``"ci"``) for each capability, in ``processes`` fresh
    processes (default: the CPU count) without ``TRITON_INTERPRET`` and with
    their own Triton cache folder. Launches of a KV cache format the Triton
    backend refuses on a capability (fp8 e4m3 before 8.9) are skipped there
    (Triton has no fp8e4nv pointer there, not even for the block copy).

    Returns:
        ``compile_launch``'s results.
    """
    if which not in CASE_SETS:
        raise ValueError(f"which must be one of {sorted(CASE_SETS)}, got {which!r}")
    processes = processes or os.cpu_count() or 1
    caps = list(capabilities)
    saved = {
        k: os.environ.get(k)
        for k in ("TRITON_INTERPRET", "TRITON_CACHE_DIR", "TRITON_DEFAULT_FP_FUSION")
    }
    with tempfile.TemporaryDirectory(prefix="pagedrs-aot-") as cache_dir:
        os.environ.pop("TRITON_INTERPRET", None)
        os.environ["TRITON_CACHE_DIR"] = cache_dir
        # Fused multiply-add, the default of a launch on a GPU.
        os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
        try:
            ctx = multiprocessing.get_context("spawn")
            with ctx.Pool(processes) as pool:
                # Processes start here and copy the environment set above.
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
                jobs = [(which, i, processes, caps) for i in range(processes)]
                parts = pool.map(_worker, jobs, chunksize=1)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    return [r for part in parts for r in part]
