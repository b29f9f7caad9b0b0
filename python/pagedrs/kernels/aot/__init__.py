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

Modules: ``cases`` (the case sets), ``capture`` (launches captured from the
launchers), ``compile`` (compiled for a target, ptxas figures, ``compile_all``
in fresh processes without ``TRITON_INTERPRET``).
"""

from __future__ import annotations

from .capture import Launch, capture_launches, unique_launches
from .cases import (
    BLOCK_SIZES,
    CASE_SETS,
    MODEL_DTYPES,
    MODEL_SHAPES,
    Case,
    cache_formats,
    ci_cases,
    full_cases,
    heavy_cases,
    min_capability,
    split_counts,
)
from .compile import CAPABILITIES, NO_SPILL_KERNELS, compile_all, compile_launch, parse_ptxas_log

__all__ = [
    "BLOCK_SIZES",
    "CAPABILITIES",
    "CASE_SETS",
    "MODEL_DTYPES",
    "MODEL_SHAPES",
    "NO_SPILL_KERNELS",
    "Case",
    "Launch",
    "cache_formats",
    "capture_launches",
    "ci_cases",
    "compile_all",
    "compile_launch",
    "full_cases",
    "heavy_cases",
    "min_capability",
    "parse_ptxas_log",
    "split_counts",
    "unique_launches",
]
