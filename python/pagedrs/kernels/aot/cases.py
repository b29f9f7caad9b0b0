"""The configurations of the engine's attention step that ahead-of-time
compilation covers (``Case``) and the named sets of them: ``full_cases`` (the
sweep of ``benches/triton_aot.py``), ``heavy_cases`` (its register-hungriest
launches) and ``ci_cases`` (``tests/kernels/test_triton_aot.py``), built from
the engine's own lists (model dtypes, ``KV_CACHE_DTYPES``, ``MAX_SPLITS``,
checkpoint shapes of every supported model type, block sizes)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

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

#: Model dtype name -> torch dtype.
_DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}


def cache_formats(model_dtype: torch.dtype) -> list[str]:
    """Distinct KV cache format names a model of ``model_dtype`` can run with:
    every ``KV_CACHE_DTYPES`` setting through ``resolve_kv_cache_dtype``."""
    from ...attention.kv_cache_dtype import resolve_kv_cache_dtype
    from ...config_values import KV_CACHE_DTYPES

    names = [resolve_kv_cache_dtype(s, model_dtype).name for s in KV_CACHE_DTYPES]
    return list(dict.fromkeys(names))


def split_counts() -> list[int]:
    """Every context split count ``paged_decode_attention`` launches: the
    powers of two up to ``MAX_SPLITS``."""
    from ..launch_config import MAX_SPLITS

    return [1 << i for i in range(MAX_SPLITS.bit_length()) if 1 << i <= MAX_SPLITS]


def min_capability(kv_cache: str) -> int:
    """Oldest compute capability (``major * 10 + minor``) the Triton backend
    runs ``kv_cache`` on (``TritonBackend.check``)."""
    if kv_cache == "fp8_e4m3":
        from ...attention.backends.triton import FP8_E4M3_MIN_CAPABILITY

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
