"""Ahead-of-time compilation of every Triton kernel launch the engine makes,
for the GPUs pagedrs targets, on a machine without a GPU.

A *case* (``Case``) is what decides a launch: the model's dtype and attention
shape (head dim, query and KV heads), the KV cache format, the block size, the
attention options (sliding window, soft cap, sinks) and the decode kernel's
context split count. ``capture_launches`` runs the real launchers
(``paged_decode_attention``, ``paged_prefill_attention``, ``write_kv``,
``copy_blocks``) on small CPU tensors of the case's shapes with each kernel's
launch intercepted, so the captured arguments (constexprs, ``num_warps``,
pointer dtypes, strides) are exactly the ones a GPU launch passes; a
``Launch`` is compiled by Triton's own argument specialization
(``create_function_from_signature``, ``_pack_args``) for a ``GPUTarget``, as
``JITFunction.run`` would on that GPU. ``triton.compile`` builds PTX and runs
the wheel's ``ptxas`` (``-v``); its log gives registers, spill bytes and the
stack frame, the compiled metadata the shared memory.

Runtime integers the launchers pass (strides, the window) are specialized by
Triton on divisibility by 16 and on equality to 1: the cases use shapes
whose block-table width (5) and window (4095) are neither, which compiles the
variant with the fewest assumptions.

The cases come from the engine's own lists: model dtypes and
``KV_CACHE_DTYPES`` through ``resolve_kv_cache_dtype``, the split counts up
to ``MAX_SPLITS``, attention shapes of a checkpoint of every
``SUPPORTED_MODEL_TYPES`` entry (``MODEL_SHAPES``), and block sizes
``BLOCK_SIZES``. ``full_cases`` is the sweep of ``benches/triton_aot.py``;
``heavy_cases`` its register-hungriest launches; ``ci_cases`` a subset
covering every kernel, model dtype, KV cache format, feature flag and
block-table path and the heaviest tile of each dot path, compiled by
``tests/kernels/test_triton_aot.py``. The launchers choose tiles, warps and
pipeline stages (``decode_config``, ``prefill_config``) so that no attention
launch spills registers.

Compilation needs ``TRITON_INTERPRET`` unset when triton is first imported:
``compile_all`` runs in fresh processes whose environment lacks it.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import multiprocessing
import os
import re
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

#: CUDA compute capabilities compiled for: A100 (sm_80) and H100 / H200 (sm_90).
CAPABILITIES: tuple[int, ...] = (80, 90)

#: Model dtypes the engine computes in (``EngineArgs.dtype``).
MODEL_DTYPES: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float16, torch.float32)

#: Block sizes compiled: 1 (the reserving allocation policies), the powers of
#: two vLLM offers (16 the default) and one that is not a power of two (the
#: engine accepts any positive block size; the decode kernel then gathers the
#: block table per token).
BLOCK_SIZES: tuple[int, ...] = (1, 8, 16, 24, 32, 64, 128)

#: model type -> attention shapes (head dim, query heads, KV heads) of real
#: checkpoints of that type; ``"tiny"`` is the device check's tiny zoo.
MODEL_SHAPES: dict[str, tuple[tuple[int, int, int], ...]] = {
    "llama": ((64, 9, 3), (128, 32, 8), (64, 32, 8)),  # SmolLM2-135M, Llama-3-8B, 3.2-1B
    "mistral": ((128, 32, 8),),  # Mistral-7B
    "qwen2": ((64, 14, 2), (128, 28, 4)),  # Qwen2.5-0.5B, Qwen2.5-7B
    "qwen3": ((128, 16, 8), (128, 40, 8)),  # Qwen3-0.6B, Qwen3-14B
    "qwen3_moe": ((128, 64, 4),),  # Qwen3-235B-A22B
    "mixtral": ((128, 32, 8),),  # Mixtral-8x7B
    "qwen2_moe": ((128, 16, 16),),  # Qwen1.5-MoE-A2.7B
    "gemma": ((256, 8, 1),),  # gemma-2b
    "gemma2": ((256, 16, 8), (128, 32, 16)),  # gemma-2-9b, gemma-2-27b
    "gemma3_text": ((256, 4, 1),),  # gemma-3-1b
    "phi3": ((96, 32, 32), (128, 40, 10)),  # Phi-3-mini, Phi-3-medium
    "gpt2": ((64, 12, 12), (64, 25, 25)),  # gpt2, gpt2-xl
    "opt": ((80, 32, 32),),  # opt-2.7b
    "gpt_neox": ((256, 8, 8),),  # pythia-1b
    "starcoder2": ((128, 48, 4),),  # starcoder2-15b
    "olmo2": ((128, 32, 32),),  # OLMo-2-7B
    "granite": ((64, 32, 8),),  # granite-3.0-2b
    "cohere": ((128, 96, 8),),  # c4ai-command-r-plus
    "stablelm": ((160, 32, 8),),  # stablelm-2-12b
    "gpt_oss": ((64, 64, 8),),  # gpt-oss-20b
    "tiny": ((16, 4, 2),),  # benches/gpu_models.py TINY_ZOO
}

#: Attention kernels whose compiled code must not spill registers.
NO_SPILL_KERNELS: tuple[str, ...] = (
    "_decode_split_kernel",
    "_decode_reduce_kernel",
    "_prefill_kernel",
)

#: Block-table width of the cases (neither 1 nor a multiple of 16).
_TABLE_WIDTH = 5
#: Sliding window of the cases, tokens (neither 1 nor a multiple of 16).
_WINDOW = 4095


def cache_formats(model_dtype: torch.dtype) -> list[str]:
    """Distinct KV cache format names a model of ``model_dtype`` can run with:
    every ``KV_CACHE_DTYPES`` setting through ``resolve_kv_cache_dtype``."""
    from ..attention.kv_cache_dtype import KV_CACHE_DTYPES, resolve_kv_cache_dtype

    names = [resolve_kv_cache_dtype(s, model_dtype).name for s in KV_CACHE_DTYPES]
    return list(dict.fromkeys(names))


def split_counts() -> list[int]:
    """Every context split count ``paged_decode_attention`` launches: the
    powers of two up to ``MAX_SPLITS``."""
    from .decode_attention import MAX_SPLITS

    return [1 << i for i in range(MAX_SPLITS.bit_length()) if 1 << i <= MAX_SPLITS]


def min_capability(kv_cache: str) -> int:
    """Oldest compute capability (``major * 10 + minor``) the Triton backend
    runs ``kv_cache`` on (``TritonBackend.check``)."""
    if kv_cache == "fp8_e4m3":
        from ..attention.backends.triton import FP8_E4M3_MIN_CAPABILITY

        major, minor = FP8_E4M3_MIN_CAPABILITY
        return major * 10 + minor
    return 0


@dataclass(frozen=True)
class Case:
    """One configuration of the engine's attention step.

    ``model_dtype`` and ``kv_cache`` are names ("bfloat16", "fp8_e5m2", ...);
    ``num_splits`` is the decode kernel's context split count.
    """

    model_dtype: str
    kv_cache: str
    head_dim: int
    num_heads: int
    num_kv_heads: int
    block_size: int = 16
    window: bool = False
    softcap: bool = False
    sinks: bool = False
    num_splits: int = 1


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


_DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}


def _storage(kv_cache: str) -> torch.dtype:
    from ..attention.kv_cache_dtype import FORMATS

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
    from .copy_blocks import _copy_blocks_kernel
    from .decode_attention import _decode_reduce_kernel, _decode_split_kernel
    from .prefill_attention import _prefill_kernel
    from .write_kv import _write_kv_kernel

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
    from .copy_blocks import copy_blocks
    from .decode_attention import paged_decode_attention
    from .prefill_attention import paged_prefill_attention
    from .write_kv import write_kv

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


# ----------------------------------------------------------------------------- cases


def _shapes() -> list[tuple[int, int, int]]:
    return list(dict.fromkeys(s for shapes in MODEL_SHAPES.values() for s in shapes))


def _dtype_pairs() -> list[tuple[str, str]]:
    return [
        (name, fmt)
        for name, dt in ((n, _DTYPES[n]) for n in ("bfloat16", "float16", "float32"))
        for fmt in cache_formats(dt)
    ]


_FLAGS = list(itertools.product((False, True), repeat=3))


def full_cases() -> list[Case]:
    """The sweep of ``benches/triton_aot.py``, deduplicated:

    - every model shape of ``MODEL_SHAPES`` in every model dtype (cache
      "auto"), without and with every option, one split and eight;
    - every (model dtype, KV cache format) pair at every head dim, GQA group
      8, options all off and all on, one split and eight;
    - every combination of the three options in every KV cache format (bfloat16
      model) at head dims 64, 128 and 256;
    - every block size at head dims 64, 128 and 256, bfloat16 and float32;
    - every split count at head dims 64, 128 and 256, sinks off and on.
    """
    cases: list[Case] = []
    head_dims = sorted({s[0] for s in _shapes()})
    for (d, hq, hkv), name in itertools.product(_shapes(), _DTYPES):
        for on, splits in itertools.product((False, True), (1, 8)):
            cases.append(
                Case(name, name, d, hq, hkv, window=on, softcap=on, sinks=on, num_splits=splits)
            )
    for (name, fmt), d in itertools.product(_dtype_pairs(), head_dims):
        for on, splits in itertools.product((False, True), (1, 8)):
            cases.append(
                Case(name, fmt, d, 8, 1, window=on, softcap=on, sinks=on, num_splits=splits)
            )
    for fmt, (w, c, s), d in itertools.product(
        cache_formats(torch.bfloat16), _FLAGS, (64, 128, 256)
    ):
        cases.append(Case("bfloat16", fmt, d, 32, 8, window=w, softcap=c, sinks=s, num_splits=4))
    for bs, d, name in itertools.product(BLOCK_SIZES, (64, 128, 256), ("bfloat16", "float32")):
        cases.append(Case(name, name, d, 32, 8, block_size=bs, num_splits=2))
    for splits, d, sinks in itertools.product(split_counts(), (64, 128, 256), (False, True)):
        cases.append(Case("bfloat16", "bfloat16", d, 32, 8, sinks=sinks, num_splits=splits))
    return list(dict.fromkeys(cases))


def ci_cases() -> list[Case]:
    """A subset of ``full_cases`` for CI (``tests/kernels/test_triton_aot.py``,
    about two minutes on two cores) that launches every kernel with every
    model dtype and KV cache format, options off and all on, one and several
    context splits, paged and per-token block tables (blocks 1, 16, 24), and
    the register-hungriest tile of each dot path (``heavy_cases``):

    - the default launch: bfloat16, head dim 128, GQA group 4, block 16;
    - every option on, head dim 128, four splits: int8 entries under float16
      dots; bfloat16 (float16 model) and fp8 e4m3 (float32 model) caches
      converted for fp32 dots;
    - every option on, head dim 256, GQA group 16: fp8 e5m2 under bfloat16
      dots (one split), int8 under fp32 dots (32 splits);
    - head dim 96 (padded to 128) with per-token tables (block 24);
    - float32 at block 1 (SmolLM2's shape), the tiny zoo's float16 shape.
    """
    on = {"window": True, "softcap": True, "sinks": True}
    return [
        Case("bfloat16", "bfloat16", 128, 32, 8),
        Case("float16", "int8", 128, 32, 8, num_splits=4, **on),
        Case("float16", "bfloat16", 128, 32, 8, num_splits=4, **on),
        Case("float32", "fp8_e4m3", 128, 32, 8, num_splits=4, **on),
        Case("bfloat16", "fp8_e5m2", 256, 16, 1, **on),
        Case("float32", "int8", 256, 16, 1, num_splits=32, **on),
        Case("bfloat16", "bfloat16", 96, 32, 32, block_size=24),
        Case("float32", "float32", 64, 9, 3, block_size=1, num_splits=2),
        Case("float16", "float16", 16, 4, 2, num_splits=8),
    ]


def heavy_cases() -> list[Case]:
    """The most register-hungry launches: every (model dtype, KV cache format)
    pair with every option on and four context splits at head dims 256 (GQA
    group 16) and 128 (group 4), block 16; and the per-token block-table
    path (block 24) of each dot path (16-bit, int8 entries, fp32, fp8
    converted to fp32). Every attention launch of ``full_cases`` has a
    smaller or equal tile than one of these on the same code path."""
    on = {"window": True, "softcap": True, "sinks": True}
    cases = [
        Case(name, fmt, d, hq, hkv, num_splits=4, **on)
        for (name, fmt), (d, hq, hkv) in itertools.product(
            _dtype_pairs(), ((256, 16, 1), (128, 32, 8))
        )
    ]
    for name, fmt in (
        ("bfloat16", "bfloat16"),
        ("float16", "int8"),
        ("float32", "float32"),
        ("float32", "fp8_e4m3"),
    ):
        cases.append(Case(name, fmt, 256, 16, 1, block_size=24, num_splits=4, **on))
    return cases


#: The case sets of ``compile_all``, by name.
CASE_SETS = {"ci": ci_cases, "heavy": heavy_cases, "full": full_cases}


def unique_launches(cases: Iterable[Case]) -> list[Launch]:
    """The distinct launches of ``cases`` (first case of each kept)."""
    seen: dict[tuple[Any, ...], Launch] = {}
    for case in cases:
        for launch in capture_launches(case):
            seen.setdefault(launch.key(), launch)
    return list(seen.values())


# ----------------------------------------------------------------------------- compile

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
