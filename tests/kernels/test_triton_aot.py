"""Every Triton kernel launch of ``aot.ci_cases`` compiles for sm_80 and sm_90
on this machine (no GPU: triton's own ptxas), and the attention kernels do
not spill registers (``pagedrs.kernels.aot``; the full sweep is
``benches/triton_aot.py``)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from pagedrs.attention.kv_cache_dtype import FORMATS  # noqa: E402
from pagedrs.kernels import aot  # noqa: E402


@pytest.fixture(scope="module")
def results() -> list[dict]:
    return aot.compile_all("ci", processes=2)


def test_every_model_shape_type_is_covered():
    from pagedrs.executor.model_support import SUPPORTED_MODEL_TYPES

    assert set(SUPPORTED_MODEL_TYPES) <= set(aot.MODEL_SHAPES)


def test_ci_cases_cover_every_dtype_and_flag():
    cases = aot.ci_cases()
    assert {c.kv_cache for c in cases} == set(FORMATS)
    assert {c.model_dtype for c in cases} == {"bfloat16", "float16", "float32"}
    for flag in ("window", "softcap", "sinks"):
        assert {getattr(c, flag) for c in cases} == {False, True}
    assert {c.num_splits > 1 for c in cases} == {False, True}
    assert {c.block_size & (c.block_size - 1) == 0 for c in cases} == {False, True}


def test_every_launch_compiles_without_attention_spills(results):
    assert {r["kernel"] for r in results} == {
        "_decode_split_kernel",
        "_decode_reduce_kernel",
        "_prefill_kernel",
        "_write_kv_kernel",
        "_copy_blocks_kernel",
    }
    assert {r["arch"] for r in results} == {"sm_80", "sm_90"}
    failed = [(r["kernel"], r["arch"], r["case"], r["error"]) for r in results if not r["ok"]]
    assert not failed, failed
    spills = [
        (r["kernel"], r["arch"], r["case"], r["spill_stores"])
        for r in results
        if r["kernel"] in aot.NO_SPILL_KERNELS and r["spill_stores"] + r["spill_loads"] > 0
    ]
    assert not spills, spills
