"""The batch-invariant float32 projection (``_core.dense_linear``,
``executor.models.dense``): a row's bits alone and inside batches of 2 to
300 rows at random positions, on every kernel variant this CPU runs and the
portable one, at every thread count; the variants' bits equal; the result
within the rounding-error bound of the kernel's summation order (module docs
of ``rust/pagedrs-kernels/src/dense``) of a float64 reference; refusals naming the array,
dtype or device; and ``batch_invariant=True`` through the engine: a
request's greedy tokens and logprobs bit-identical alone and in a batch of
16 other requests, on the native model and on HF's modules."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from pagedrs import LLM, EngineArgs, SamplingParams, _core
from pagedrs.executor.batch_invariant import BatchInvariantLinear, make_batch_invariant
from pagedrs.executor.model_runner import ModelRunner
from pagedrs.executor.models.dense import DenseWeight, dense_isas
from pagedrs.executor.models.linear import Linear, onednn_bf16_packing
from reference import PROMPTS
from torch import nn

ISAS = dense_isas()
#: (K, N): odd feature counts (K not a multiple of 8 or 16, N = 1) and the
#: default model's shapes.
SHAPES = [(1, 1), (7, 3), (13, 1), (67, 5), (577, 13), (576, 64), (1536, 9)]


def _project(
    x: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor | None,
    isa: str | None = None,
    threads: int = 2,
) -> torch.Tensor:
    out = torch.empty(x.shape[0], w.shape[0])
    _core.dense_linear(
        x.numpy(), w.numpy(), out.numpy(), None if b is None else b.numpy(), threads, isa
    )
    return out


def _bits(t: torch.Tensor) -> np.ndarray:
    return t.numpy().view(np.uint32)


def test_variants_include_portable() -> None:
    assert ISAS[-1] == "portable"
    assert set(ISAS) <= {"avx2", "portable"}


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("with_bias", [False, True])
def test_a_row_alone_equals_the_row_in_every_batch_of_2_to_300(isa: str, with_bias: bool) -> None:
    gen = torch.Generator().manual_seed(1)
    k, n = 67, 13
    w = torch.randn(n, k, generator=gen)
    b = torch.randn(n, generator=gen) if with_bias else None
    row = torch.randn(1, k, generator=gen)
    alone = _bits(_project(row, w, b, isa, threads=1))
    for m in range(2, 301):
        x = torch.randn(m, k, generator=gen)
        at = int(torch.randint(m, (1,), generator=gen))
        x[at] = row[0]
        got = _bits(_project(x, w, b, isa, threads=1 + m % 3))
        assert (got[at] == alone[0]).all(), (m, at)


@pytest.mark.parametrize(("k", "n"), [(576, 1536), (1536, 576), (577, 49)])
def test_model_shapes_are_batch_invariant(k: int, n: int) -> None:
    gen = torch.Generator().manual_seed(2)
    w, b = torch.randn(n, k, generator=gen), torch.randn(n, generator=gen)
    rows = torch.randn(8, k, generator=gen)
    alone = np.stack([_bits(_project(rows[i : i + 1], w, b))[0] for i in range(8)])
    for m in (2, 5, 8, 9, 16, 17, 64, 65, 256, 300):
        x = torch.randn(m, k, generator=gen)
        at = torch.randperm(m, generator=gen)[: min(m, 8)]
        x[at] = rows[: len(at)]
        got = _bits(_project(x, w, b))
        assert (got[at.numpy()] == alone[: len(at)]).all(), m


@pytest.mark.parametrize(("k", "n"), SHAPES)
def test_every_variant_gives_the_same_bits(k: int, n: int) -> None:
    gen = torch.Generator().manual_seed(3)
    x, w, b = torch.randn(11, k, generator=gen), torch.randn(n, k, generator=gen), torch.randn(n)
    want = _bits(_project(x, w, b, "portable", threads=1))
    for isa in ISAS:
        for threads in (1, 2, 3):
            assert (_bits(_project(x, w, b, isa, threads)) == want).all(), (isa, threads)


def _gamma(k: int) -> float:
    """Higham's ``gamma(L) = L u / (1 - L u)`` for the kernel's longest chain
    of roundings: ``ceil(K / 8)`` lane FMAs, 3 tree additions, 7 tail FMAs."""
    u = 2.0**-24
    length = math.ceil(k / 8) + 10
    return length * u / (1 - length * u)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize(("k", "n"), SHAPES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_within_the_rounding_bound_of_float64(isa: str, k: int, n: int, with_bias: bool) -> None:
    gen = torch.Generator().manual_seed(4)
    x, w = torch.randn(6, k, generator=gen), torch.randn(n, k, generator=gen)
    b = torch.randn(n, generator=gen) if with_bias else None
    got = _project(x, w, b, isa).double()
    exact = x.double() @ w.double().T
    magnitude = x.double().abs() @ w.double().abs().T
    bound = _gamma(k) * magnitude
    if b is not None:
        exact = exact + b.double()
        # The bias addition rounds once more: half an ulp of |s + b|.
        bound = bound + 2.0**-24 * ((1 + _gamma(k)) * magnitude + b.double().abs())
    assert ((got - exact).abs() <= bound).all()


def test_refusals_name_the_array() -> None:
    x, w, out = (
        np.zeros((2, 8), np.float32),
        np.zeros((3, 8), np.float32),
        np.zeros((2, 3), np.float32),
    )
    with pytest.raises(ValueError, match="x must be a 2-d float32"):
        _core.dense_linear(x.astype(np.float64), w, out)
    with pytest.raises(ValueError, match="weight .* is not \\[N, 8\\]"):
        _core.dense_linear(x, np.zeros((3, 9), np.float32), out)
    with pytest.raises(ValueError, match="out .* is not \\[2, 3\\]"):
        _core.dense_linear(x, w, np.zeros((3, 2), np.float32))
    with pytest.raises(ValueError, match="bias .* is not \\[3\\]"):
        _core.dense_linear(x, w, out, np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="weight must be C-contiguous"):
        _core.dense_linear(x, np.zeros((8, 3), np.float32).T, out)  # Fortran order
    with pytest.raises(ValueError, match="x must be C-contiguous"):
        _core.dense_linear(np.zeros((2, 16), np.float32)[:, ::2], w, out)
    with pytest.raises(ValueError, match='variant "sse9"'):
        _core.dense_linear(x, w, out, isa="sse9")
    with pytest.raises(ValueError, match="float32 CPU weights"):
        DenseWeight(torch.zeros(3, 8, dtype=torch.float16))
    with pytest.raises(ValueError, match="float32 CPU inputs"):
        DenseWeight(torch.zeros(3, 8))(torch.zeros(2, 8, dtype=torch.float64))


def test_linear_runs_the_dense_kernel_for_float32_and_refuses_what_it_cannot_cover() -> None:
    gen = torch.Generator().manual_seed(5)
    w, b = torch.randn(37, 100, generator=gen), torch.randn(37, generator=gen)
    lin = Linear(w, b, batch_invariant=True)
    assert lin.dense is not None and lin.dense.weight.data_ptr() == w.data_ptr()  # in place
    x, res = torch.randn(5, 100, generator=gen), torch.randn(5, 37, generator=gen)
    assert torch.equal(lin(x), _project(x, w, b))
    assert torch.equal(lin.add_to(res, x), res + _project(x, w, b))
    assert Linear(w, b).dense is None  # off by default: F.linear, HF's bits
    with pytest.raises(ValueError, match="batch_invariant: .*float16 is not covered"):
        Linear(w.half(), batch_invariant=True)
    with pytest.raises(ValueError, match="batch_invariant: .* on meta: .* CPU only"):
        Linear(torch.empty(4, 4, device="meta"), batch_invariant=True)
    if not onednn_bf16_packing():
        with pytest.raises(ValueError, match="batch_invariant: .*bfloat16 needs oneDNN"):
            Linear(w.bfloat16(), batch_invariant=True)
        with pytest.raises(ValueError, match="batch_invariant: dtype='bfloat16'"):
            EngineArgs(dtype="bfloat16", batch_invariant=True)
    with pytest.raises(ValueError, match="batch_invariant: attention_backend='torch'"):
        EngineArgs(attention_backend="torch", batch_invariant=True)
    with pytest.raises(ValueError, match="batch_invariant: tensor_parallel_size"):
        EngineArgs(tensor_parallel_size=2, batch_invariant=True)


def test_hf_modules_are_replaced_and_other_matmul_weights_refused() -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    cfg = AutoConfig.for_model(
        "qwen3", vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, tie_word_embeddings=True,
    )  # fmt: skip
    model = AutoModelForCausalLM.from_config(cfg).eval()
    linears = sum(isinstance(m, nn.Linear) for m in model.modules())
    assert make_batch_invariant(model) == linears == 2 * 7 + 1
    assert not any(isinstance(m, nn.Linear) for m in model.modules())
    head = model.get_output_embeddings()
    assert isinstance(head, BatchInvariantLinear)
    assert head.weight is model.get_input_embeddings().weight  # still tied
    x = torch.randn(3, 5, 32)
    assert torch.equal(
        head(x), _project(x.reshape(-1, 32), head.weight.detach(), None).view(3, 5, -1)
    )
    gpt2 = AutoModelForCausalLM.from_config(
        AutoConfig.for_model("gpt2", n_embd=32, n_layer=1, n_head=2, vocab_size=64)
    )
    with pytest.raises(ValueError, match="batch_invariant: .*c_attn.weight \\(Conv1D"):
        make_batch_invariant(gpt2)


def _greedy_with_logprobs(llm: LLM, prompts: list[str], max_tokens: int) -> list[tuple]:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=3, ignore_eos=True)
    outs = llm.generate(prompts, params, use_tqdm=False)
    result = []
    for o in outs:
        c = o.outputs[0]
        assert c.logprobs is not None
        steps = [sorted((t, lp.logprob, lp.rank) for t, lp in step.items()) for step in c.logprobs]
        result.append((list(c.token_ids), steps, c.cumulative_logprob))
    return result


def _others(n: int) -> list[str]:
    return [f"{PROMPTS[i % len(PROMPTS)]} (variant {i})" for i in range(n)]


@pytest.mark.parametrize("model_impl", ["pagedrs", "transformers"])
def test_engine_request_alone_equals_request_in_a_batch_of_16(
    model_impl: str, default_model_dir: Path, tiny_model_dir: Path
) -> None:
    model = default_model_dir if model_impl == "pagedrs" else tiny_model_dir
    llm = LLM(
        str(model),
        dtype="float32",
        batch_invariant=True,
        model_impl=model_impl,
        enable_prefix_caching=False,
        max_model_len=256,
        kv_cache_memory_bytes=256 << 20,
    )
    runner = llm.llm_engine.engine_core.runner
    assert isinstance(runner, ModelRunner)
    if model_impl == "pagedrs":
        assert runner.native is not None and isinstance(runner.native.lm_head, Linear)
        assert runner.native.lm_head.dense is not None
        assert all(getattr(layer.qkv, "dense", None) for layer in runner.native.layers)
    else:
        assert runner.native is None and isinstance(runner.lm_head, BatchInvariantLinear)
    probes = [PROMPTS[0], PROMPTS[3]]  # a short and a long prompt
    alone = [_greedy_with_logprobs(llm, [p], 16)[0] for p in probes]
    batch = _others(16)
    batch.insert(5, probes[0])
    batch.insert(12, probes[1])
    together = _greedy_with_logprobs(llm, batch, 16)
    assert [together[5], together[12]] == alone, model_impl
    llm.llm_engine.shutdown()
