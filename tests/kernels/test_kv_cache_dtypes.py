"""KV cache dtypes (``kv_cache_dtype``) through every attention backend: the
torch reference's formats (int8 entries with their scale, saturating fp8),
each backend's writes bit for bit equal to the reference's, attention within
tolerance of it, block copies and swaps moving scales with their values, the
Rust decode kernel's batch invariance, the spec's bytes per block, and the
refusals at start."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from pagedrs._core import KVCacheGroupBatch, StepBatch  # noqa: E402
from pagedrs.attention import torch_ops  # noqa: E402
from pagedrs.attention.backends import (  # noqa: E402
    BACKENDS,
    AttentionOptions,
    get_attention_backend,
)
from pagedrs.attention.backends.triton import TritonBackend  # noqa: E402
from pagedrs.attention.kv_cache_dtype import (  # noqa: E402
    FORMATS,
    dequantize,
    quantize,
    resolve_kv_cache_dtype,
)
from pagedrs.attention.metadata import AttentionMetadata  # noqa: E402
from pagedrs.engine.arg_utils import EngineArgs  # noqa: E402
from pagedrs.executor.kv_cache import KVCacheSpec  # noqa: E402
from test_attention_backends import _batch  # noqa: E402

KV_DTYPES = ["float32", "bfloat16", "fp8_e4m3", "fp8_e5m2", "int8"]
GPU = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
BS, HQ, HKV, D, N = 4, 4, 2, 16, 32
#: Attention output tolerance against the reference, by the model dtype.
TOL = {torch.float32: {"atol": 1e-5, "rtol": 1e-5}, torch.bfloat16: {"atol": 2e-2, "rtol": 2e-2}}


def _device(name: str) -> torch.device:
    return GPU if name == "triton" else torch.device("cpu")


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.cpu().contiguous().view(torch.uint8)


def _caches(kv: str, num_blocks: int, gen: torch.Generator, dev: torch.device) -> list:
    """A key and a value cache of ``kv`` entries holding random stored values."""
    f = FORMATS[kv]
    out = []
    for _ in range(2):
        x = torch.randn(num_blocks, HKV, BS, D, generator=gen) * 2
        out.append(quantize(x, f.storage).to(dev))
    return out


def test_int8_entries_hold_values_and_a_bf16_scale() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(6, 3, 64, generator=gen) * 4
    x[0, 0] = 0.0
    e = quantize(x, torch.int8)
    assert e.shape == (6, 3, 66) and e.dtype == torch.int8
    scale = e[..., 64:].contiguous().view(torch.bfloat16).float()
    want = (x.abs().amax(-1, keepdim=True) / 127).to(torch.bfloat16).float()
    assert torch.equal(scale, want)
    err = (dequantize(e, torch.float32) - x).abs()
    assert bool((err <= scale / 2 * (1 + 1e-6) + 1e-12).all())
    assert int(e[0, 0, :64].abs().max()) == 0 and float(scale[0, 0]) == 0.0
    assert int(e[1:, :, :64].abs().amax(-1).min()) == 127


def test_fp8_saturates_and_reads_back_exactly() -> None:
    x = torch.tensor([1e6, -1e6, 0.3, 2.0**-9, 1.0])
    assert quantize(x, torch.float8_e4m3fn).float().tolist() == [448, -448, 0.3125, 2**-9, 1]
    assert quantize(x, torch.float8_e5m2).float()[:2].tolist() == [57344, -57344]


@pytest.mark.parametrize("name", ["cpu", "triton"])
@pytest.mark.parametrize("kv", KV_DTYPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_write_kv_stores_the_reference_bits(name: str, kv: str, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(len(kv))
    f, dev = FORMATS[kv], _device(name)
    k = (torch.randn(12, HKV, D, generator=gen) * 3).to(dtype)
    v = torch.randn(12, HKV, D, generator=gen).to(dtype)
    k[0, 0] = 0.0
    k[1, 1] = 1000.0  # saturates fp8_e4m3
    k[2, 0] *= 1e-3  # fp8 subnormals
    slots = torch.randperm(N * BS, generator=gen)[:12]
    slots[3] = -1  # padding
    shape = (N, HKV, BS, f.entry_size(D))
    want = [torch.zeros(shape, dtype=f.storage) for _ in range(2)]
    torch_ops.write_kv(k, v, *want, slots)
    got = [torch.zeros(shape, dtype=f.storage, device=dev) for _ in range(2)]
    get_attention_backend(name).write_kv(k.to(dev), v.to(dev), *got, slots.to(dev))
    for g, w in zip(got, want, strict=True):
        assert torch.equal(_bits(g), _bits(w))


def _forward(
    name: str, kv: str, dtype: torch.dtype, ctx: list[int], new: list[int], seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(output, key cache, value cache) of one layer's forward on a step."""
    batch = _batch(ctx, new, torch.Generator().manual_seed(len(ctx)))
    gen = torch.Generator().manual_seed(seed)
    dev = _device(name)
    kc, vc = _caches(kv, N, gen, dev)
    t = batch.num_tokens
    q = torch.randn(t, HQ, D, generator=gen).to(dtype).to(dev)
    k = torch.randn(t, HKV, D, generator=gen).to(dtype).to(dev)
    v = torch.randn(t, HKV, D, generator=gen).to(dtype).to(dev)
    meta = AttentionMetadata.from_batch(batch, dev)
    out = get_attention_backend(name).forward(q, k, v, kc, vc, meta, AttentionOptions(D**-0.5))
    return out.cpu(), kc.cpu(), vc.cpu()


@pytest.mark.parametrize("name", sorted(BACKENDS))
@pytest.mark.parametrize("kv", KV_DTYPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("ctx", "new"),
    [([0, 3, 9], [1, 1, 1]), ([0, 5, 2, 7], [6, 1, 3, 1])],
    ids=["decode", "mixed"],
)
def test_forward_matches_the_reference(
    name: str, kv: str, dtype: torch.dtype, ctx: list[int], new: list[int]
) -> None:
    want, want_k, want_v = _forward("torch", kv, dtype, ctx, new, seed=5)
    got, got_k, got_v = _forward(name, kv, dtype, ctx, new, seed=5)
    torch.testing.assert_close(got.float(), want.float(), **TOL[dtype])
    assert torch.equal(_bits(got_k), _bits(want_k)) and torch.equal(_bits(got_v), _bits(want_v))


def _decode(
    name: str, q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, table: list
) -> torch.Tensor:
    dev = kc.device
    tables = torch.tensor(table, dtype=torch.int32, device=dev)
    lens = torch.full((len(table),), BS * len(table[0]) - 1, dtype=torch.int32, device=dev)
    return (
        get_attention_backend(name)
        .decode(q.to(dev), kc, vc, tables, lens, AttentionOptions(D**-0.5))
        .cpu()
    )


@pytest.mark.parametrize("name", sorted(BACKENDS))
@pytest.mark.parametrize("kv", ["bfloat16", "fp8_e5m2", "int8"])
def test_copy_on_write_and_swaps_move_scales_with_values(name: str, kv: str) -> None:
    gen = torch.Generator().manual_seed(11)
    backend, dev = get_attention_backend(name), _device(name)
    kc, vc = _caches(kv, N, gen, dev)
    q = torch.randn(1, HQ, D, generator=gen)
    before = _decode(name, q, kc, vc, [[1, 2, 3]])
    backend.copy_blocks([(kc, vc)], torch.tensor([[1, 9], [2, 10], [3, 11]], device=dev))
    assert torch.equal(_decode(name, q, kc, vc, [[9, 10, 11]]), before)
    host = [tuple(torch.zeros(4, *kc.shape[1:], dtype=kc.dtype) for _ in range(2))]
    backend.swap_blocks([(kc, vc)], host, torch.tensor([[9, 0], [10, 1], [11, 2]]))
    kc[9:12] = 0
    vc[9:12] = 0
    backend.swap_blocks(host, [(kc, vc)], torch.tensor([[0, 20], [1, 21], [2, 22]]))
    assert torch.equal(_decode(name, q, kc, vc, [[20, 21, 22]]), before)


@pytest.mark.parametrize("kv", KV_DTYPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rust_decode_of_a_sequence_alone_equals_in_a_batch_of_64(
    kv: str, dtype: torch.dtype
) -> None:
    gen = torch.Generator().manual_seed(3)
    cpu = get_attention_backend("cpu")
    hq, hkv, d, bs, width = 9, 3, 64, 16, 6
    num_blocks = 64 * width
    f = FORMATS[kv]
    kc, vc = (
        quantize(torch.randn(num_blocks, hkv, bs, d, generator=gen), f.storage) for _ in range(2)
    )
    tables = torch.randperm(num_blocks, generator=gen).int().reshape(64, width)
    lens = torch.randint(1, width * bs + 1, (64,), generator=gen).int()
    q = torch.randn(64, hq, d, generator=gen).to(dtype)
    batch = cpu.decode(q, kc, vc, tables, lens, AttentionOptions(d**-0.5))
    for s in (0, 17, 63):
        alone = cpu.decode(
            q[s : s + 1], kc, vc, tables[s : s + 1], lens[s : s + 1], AttentionOptions(d**-0.5)
        )
        assert torch.equal(alone[0].view(torch.uint8), batch[s].view(torch.uint8))


@pytest.mark.parametrize("kv", KV_DTYPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [None, 21])
def test_rust_prefill_token_equals_its_decode_whole_or_chunked(
    kv: str, dtype: torch.dtype, window: int | None
) -> None:
    """A prompt of 40 tokens behind 7 cached ones, prefilled by the Rust
    kernels in one step, in chunks of 5 beside another sequence, and token by
    token as decodes: each token's attention output has the same bits."""
    gen = torch.Generator().manual_seed(8)
    cpu = get_attention_backend("cpu")
    hq, hkv, d, bs = 9, 3, 64, 16
    kc, vc = (
        quantize(torch.randn(64, hkv, bs, d, generator=gen), FORMATS[kv].storage) for _ in range(2)
    )
    table = torch.randperm(64, generator=gen)[:4].int()
    q = torch.randn(47, hq, d, generator=gen).to(dtype)
    opts = {"sliding_window": window, "softcap": 30.0}

    def meta(chunks: list[tuple[int, int]]) -> AttentionMetadata:
        """Sequence 0: tokens [start, end) of the prompt; sequence 1: a decode."""
        ((start, end),) = chunks
        batch = StepBatch(
            input_ids=np.zeros(end - start + 1, np.int64),
            positions=np.array([*range(start, end), 30], np.int64),
            query_start_loc=np.array([0, end - start, end - start + 1], np.int32),
            seq_lens=np.array([end, 31], np.int32),
            seq_request_ids=np.arange(2, dtype=np.uint64),
            kv_groups=[
                KVCacheGroupBatch(
                    np.full(end - start + 1, -1, np.int64),
                    torch.stack([table, table.flip(0)]).numpy(),
                )
            ],
            logits_indices=np.array([end - start - 1, end - start], np.int64),
            sample_request_ids=np.arange(2, dtype=np.uint64),
            temperature=np.zeros(2, np.float32),
            top_p=np.ones(2, np.float32),
            top_k=np.full(2, -1, np.int32),
            seed=np.full(2, -1, np.int64),
            num_output_tokens=np.zeros(2, np.int64),
            num_samples=np.ones(2, np.int32),
        )
        return AttentionMetadata.from_batch(batch, torch.device("cpu"))

    def mixed(start: int, end: int) -> torch.Tensor:
        qs = torch.cat([q[start:end], q[30:31]])
        return cpu.mixed(
            qs, qs, qs, kc, vc, meta([(start, end)]), AttentionOptions(d**-0.5, **opts)
        )[:-1]

    whole = mixed(7, 47)
    chunked = torch.cat([mixed(s, min(s + 5, 47)) for s in range(7, 47, 5)])
    decodes = torch.cat(
        [
            cpu.decode(
                q[t : t + 1],
                kc,
                vc,
                table[None],
                torch.tensor([t + 1], dtype=torch.int32),
                AttentionOptions(d**-0.5, **opts),
            )
            for t in range(7, 47)
        ]
    )
    assert torch.equal(whole.view(torch.uint8), chunked.view(torch.uint8))
    assert torch.equal(whole.view(torch.uint8), decodes.view(torch.uint8))
    want = torch_ops.paged_decode_attention(
        q[7:47].float(),
        kc,
        vc,
        table[None].expand(40, -1).contiguous(),
        torch.arange(8, 48, dtype=torch.int32),
        d**-0.5,
        **opts,
    )
    torch.testing.assert_close(whole.float(), want, atol=1e-2, rtol=8e-3)


@pytest.mark.parametrize("kv", KV_DTYPES)
def test_rust_decode_of_bf16_queries_is_float32_attention_rounded(kv: str) -> None:
    """bfloat16 queries: float32 attention over the stored values, to one
    bfloat16 rounding of the output (AVX-512 BF16 dot products included)."""
    gen = torch.Generator().manual_seed(4)
    f = FORMATS[kv]
    kc, vc = (quantize(torch.randn(N, HKV, BS, 64, generator=gen), f.storage) for _ in range(2))
    q = torch.randn(3, HQ, 64, generator=gen).to(torch.bfloat16)
    tables = torch.randperm(N, generator=gen)[:12].int().reshape(3, 4)
    lens = torch.tensor([1, 9, 16], dtype=torch.int32)
    got = get_attention_backend("cpu").decode(q, kc, vc, tables, lens, AttentionOptions(0.125))
    want = torch_ops.paged_decode_attention(q.float(), kc, vc, tables, lens, 0.125)
    torch.testing.assert_close(got.float(), want, atol=1e-2, rtol=8e-3)


def test_bytes_per_block_count_scales_and_int8_holds_3_8x_float32() -> None:
    specs = {
        kv: KVCacheSpec(30, 3, 64, 16, torch.float32, kv_cache_dtype=kv)
        for kv in ("auto", "bfloat16", "fp8", "int8")
    }
    assert specs["auto"].bytes_per_block == 2 * 30 * 3 * 16 * 64 * 4
    assert specs["int8"].bytes_per_block == 2 * 30 * 3 * 16 * (64 + 2)
    assert specs["int8"].entry_size == 66 and specs["int8"].cache_dtype.storage == torch.int8
    budget = 1 << 30
    base = specs["auto"].num_blocks(budget)
    ratios = {kv: s.num_blocks(budget) / base for kv, s in specs.items()}
    assert ratios["bfloat16"] == pytest.approx(2.0, abs=1e-3)
    assert ratios["fp8"] == pytest.approx(4.0, abs=1e-3)
    assert ratios["int8"] >= 3.8  # 256 / 66 = 3.88
    (k, v), *_ = specs["int8"].allocate(3, torch.device("cpu"))
    assert k.shape == (3, 3, 16, 66) and v.dtype == torch.int8


def test_resolution_and_refusals_name_the_dtype(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_kv_cache_dtype("auto", torch.bfloat16).name == "bfloat16"
    assert resolve_kv_cache_dtype("fp8", torch.float32).name == "fp8_e4m3"
    assert resolve_kv_cache_dtype("int8_per_token_head", torch.float32).name == "int8"
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of"):
        EngineArgs(kv_cache_dtype="int4")
    args = EngineArgs(dtype="bfloat16", kv_cache_dtype="int8", device="cpu")
    assert args.resolved_attention_backend() == "cpu"
    assert EngineArgs(dtype="float16", device="cpu").resolved_attention_backend() == "torch"
    with pytest.raises(ValueError, match="kv_cache_dtype='int8'.*float16"):
        EngineArgs(dtype="float16", kv_cache_dtype="int8", attention_backend="cpu", device="cpu")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    with pytest.raises(ValueError, match="kv_cache_dtype='fp8_e4m3'"):
        TritonBackend.check(FORMATS["fp8_e4m3"], torch.bfloat16, torch.device("cuda"))
    TritonBackend.check(FORMATS["int8"], torch.bfloat16, torch.device("cuda"))
