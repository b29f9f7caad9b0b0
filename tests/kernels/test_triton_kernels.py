"""The Triton kernels (pagedrs.kernels) against the torch reference (torch_ops).

Without a GPU the kernels run in the Triton interpreter, which must be chosen
before triton is first imported; sizes are kept small because it is slow.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import inspect  # noqa: E402

import pytest  # noqa: E402
from pagedrs import kernels  # noqa: E402
from pagedrs.attention import torch_ops  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {"atol": 1e-5, "rtol": 1e-5}


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(*shape: int, gen: torch.Generator, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=gen).to(device=DEVICE, dtype=dtype)


def _block_tables(
    seq_lens: list[int], block_size: int, num_blocks: int, gen: torch.Generator, extra: int = 2
) -> torch.Tensor:
    """Shuffled, disjoint physical blocks per sequence; the padding holds random
    (valid but unrelated) block ids, so reading it unmasked would show."""
    need = [-(-n // block_size) for n in seq_lens]
    assert sum(need) <= num_blocks
    perm = torch.randperm(num_blocks, generator=gen)
    width = max(need) + extra
    table = torch.randint(0, num_blocks, (len(seq_lens), width), generator=gen)
    used = 0
    for s, n in enumerate(need):
        table[s, :n] = perm[used : used + n]
        used += n
    return table.to(device=DEVICE, dtype=torch.int32)


def _caches(num_blocks, num_kv_heads, block_size, head_dim, gen, dtype=torch.float32):
    shape = (num_blocks, num_kv_heads, block_size, head_dim)
    return _randn(*shape, gen=gen, dtype=dtype), _randn(*shape, gen=gen, dtype=dtype)


def _positional_params(fn) -> list[str]:
    return [
        p.name
        for p in inspect.signature(fn).parameters.values()
        if p.kind is p.POSITIONAL_OR_KEYWORD
    ]


@pytest.mark.parametrize("name", ["write_kv", "paged_decode_attention", "paged_prefill_attention"])
def test_same_signature_as_reference(name):
    assert _positional_params(getattr(kernels, name)) == _positional_params(
        getattr(torch_ops, name)
    )


@pytest.mark.parametrize("block_size", [8, 16])
@pytest.mark.parametrize("num_kv_heads,head_dim", [(2, 16), (3, 24)])
def test_write_kv(block_size, num_kv_heads, head_dim):
    gen = _gen(0)
    num_blocks, num_tokens = 6, 21
    key_cache, value_cache = _caches(num_blocks, num_kv_heads, block_size, head_dim, gen)
    # Non-contiguous K/V, as when sliced out of a fused projection.
    kv = _randn(num_tokens, 2 * num_kv_heads, head_dim, gen=gen)
    key, value = kv[:, :num_kv_heads], kv[:, num_kv_heads:]
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[[0, 5, 6, num_tokens - 1]] = -1  # padding tokens
    slots = slots.to(device=DEVICE, dtype=torch.int64)

    ref_k, ref_v = key_cache.clone(), value_cache.clone()
    torch_ops.write_kv(key, value, ref_k, ref_v, slots)
    kernels.write_kv(key, value, key_cache, value_cache, slots)
    torch.testing.assert_close(key_cache, ref_k, atol=0, rtol=0)
    torch.testing.assert_close(value_cache, ref_v, atol=0, rtol=0)


def test_write_kv_casts_to_cache_dtype():
    gen = _gen(1)
    key_cache, value_cache = _caches(4, 2, 8, 16, gen, dtype=torch.float16)
    key, value = _randn(5, 2, 16, gen=gen), _randn(5, 2, 16, gen=gen)
    slots = torch.tensor([3, -1, 9, 31, 16], device=DEVICE, dtype=torch.int64)
    ref_k, ref_v = key_cache.clone(), value_cache.clone()
    torch_ops.write_kv(key, value, ref_k, ref_v, slots)
    kernels.write_kv(key, value, key_cache, value_cache, slots)
    torch.testing.assert_close(key_cache, ref_k, atol=0, rtol=0)
    torch.testing.assert_close(value_cache, ref_v, atol=0, rtol=0)


@pytest.mark.parametrize("block_size", [8, 16])
@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 2), (2, 2), (4, 1)])
def test_decode_attention(block_size, num_heads, num_kv_heads):
    gen = _gen(2)
    head_dim = 16 if num_heads == num_kv_heads else 32
    bs = block_size
    # 1, bs-1, bs, bs+1, partially filled last blocks and a multi-iteration one.
    seq_lens = [1, bs - 1, bs, bs + 1, 2 * bs + 3, 3 * bs, 70]
    num_blocks = sum(-(-n // bs) for n in seq_lens) + 5
    key_cache, value_cache = _caches(num_blocks, num_kv_heads, bs, head_dim, gen)
    block_tables = _block_tables(seq_lens, bs, num_blocks, gen)
    query = _randn(len(seq_lens), num_heads, head_dim, gen=gen)
    lens = torch.tensor(seq_lens, device=DEVICE, dtype=torch.int32)
    scale = head_dim**-0.5

    ref = torch_ops.paged_decode_attention(query, key_cache, value_cache, block_tables, lens, scale)
    out = kernels.paged_decode_attention(query, key_cache, value_cache, block_tables, lens, scale)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    torch.testing.assert_close(out, ref, **TOL)


@pytest.mark.parametrize("block_size,head_dim,block_n", [(12, 24, 16), (32, 16, 16)])
def test_decode_attention_odd_shapes(block_size, head_dim, block_n):
    """Block size / head dim that are not powers of two, tiles smaller than a block."""
    gen = _gen(3)
    seq_lens = [1, block_size - 1, block_size + 1, 2 * block_size + 5]
    num_blocks = sum(-(-n // block_size) for n in seq_lens) + 3
    key_cache, value_cache = _caches(num_blocks, 2, block_size, head_dim, gen)
    block_tables = _block_tables(seq_lens, block_size, num_blocks, gen)
    query = _randn(len(seq_lens), 6, head_dim, gen=gen)
    lens = torch.tensor(seq_lens, device=DEVICE, dtype=torch.int32)

    ref = torch_ops.paged_decode_attention(query, key_cache, value_cache, block_tables, lens, 0.3)
    out = kernels.paged_decode_attention(
        query, key_cache, value_cache, block_tables, lens, 0.3, block_n=block_n
    )
    torch.testing.assert_close(out, ref, **TOL)


def _prefill_case(block_size, with_prefix):
    bs = block_size
    q_lens = [1, bs - 1, bs, bs + 1, 2 * bs + 5, 0, 3]  # 0: a sequence with no new rows
    if with_prefix:
        prefix = [5, 0, bs, 2 * bs - 1, 1, 7, 3 * bs + 2]
    else:
        prefix = [0] * len(q_lens)
    seq_lens = [q + p for q, p in zip(q_lens, prefix, strict=True)]
    starts = [0]
    for q in q_lens:
        starts.append(starts[-1] + q)
    return q_lens, seq_lens, starts


@pytest.mark.parametrize("block_size", [8, 16])
@pytest.mark.parametrize("with_prefix", [False, True])
@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 2), (2, 2)])
@pytest.mark.parametrize("tiles", [(16, 16), (None, None), (64, 32)])
def test_prefill_attention(block_size, with_prefix, num_heads, num_kv_heads, tiles):
    gen = _gen(4)
    head_dim = 16 if num_heads == num_kv_heads else 24
    q_lens, seq_lens, starts = _prefill_case(block_size, with_prefix)
    num_blocks = sum(-(-n // block_size) for n in seq_lens) + 4
    key_cache, value_cache = _caches(num_blocks, num_kv_heads, block_size, head_dim, gen)
    block_tables = _block_tables(seq_lens, block_size, num_blocks, gen)
    # Non-contiguous query, as when sliced out of a fused QKV projection.
    qkv = _randn(starts[-1], num_heads + 2 * num_kv_heads, head_dim, gen=gen)
    query = qkv[:, :num_heads]
    qsl = torch.tensor(starts, device=DEVICE, dtype=torch.int32)
    lens = torch.tensor(seq_lens, device=DEVICE, dtype=torch.int32)
    scale = head_dim**-0.5

    ref = torch_ops.paged_prefill_attention(
        query, key_cache, value_cache, block_tables, qsl, lens, scale
    )
    block_m, block_n = tiles
    out = kernels.paged_prefill_attention(
        query,
        key_cache,
        value_cache,
        block_tables,
        qsl,
        lens,
        scale,
        block_m=block_m,
        block_n=block_n,
    )
    assert out.shape == ref.shape and out.dtype == ref.dtype
    torch.testing.assert_close(out, ref, **TOL)


def test_prefill_then_decode_end_to_end():
    """write_kv + prefill, then write_kv + decode for the next token, as the engine does."""
    gen = _gen(5)
    bs, num_heads, num_kv_heads, head_dim = 8, 4, 2, 16
    q_lens = [11, 3, 17]
    num_blocks = 12
    key_cache, value_cache = _caches(num_blocks, num_kv_heads, bs, head_dim, gen)
    ref_kc, ref_vc = key_cache.clone(), value_cache.clone()
    block_tables = _block_tables([n + 1 for n in q_lens], bs, num_blocks, gen)
    table = block_tables.long()

    def slots_for(positions_per_seq):
        out = []
        for s, positions in enumerate(positions_per_seq):
            for p in positions:
                out.append(int(table[s, p // bs]) * bs + p % bs)
        return torch.tensor(out, device=DEVICE, dtype=torch.int64)

    total = sum(q_lens)
    q = _randn(total, num_heads, head_dim, gen=gen)
    k = _randn(total, num_kv_heads, head_dim, gen=gen)
    v = _randn(total, num_kv_heads, head_dim, gen=gen)
    slots = slots_for([range(n) for n in q_lens])
    qsl = torch.tensor([0, 11, 14, 31], device=DEVICE, dtype=torch.int32)
    lens = torch.tensor(q_lens, device=DEVICE, dtype=torch.int32)

    torch_ops.write_kv(k, v, ref_kc, ref_vc, slots)
    kernels.write_kv(k, v, key_cache, value_cache, slots)
    ref = torch_ops.paged_prefill_attention(q, ref_kc, ref_vc, block_tables, qsl, lens, 0.25)
    out = kernels.paged_prefill_attention(q, key_cache, value_cache, block_tables, qsl, lens, 0.25)
    torch.testing.assert_close(out, ref, **TOL)

    q = _randn(3, num_heads, head_dim, gen=gen)
    k = _randn(3, num_kv_heads, head_dim, gen=gen)
    v = _randn(3, num_kv_heads, head_dim, gen=gen)
    slots = slots_for([[n] for n in q_lens])
    lens = lens + 1
    torch_ops.write_kv(k, v, ref_kc, ref_vc, slots)
    kernels.write_kv(k, v, key_cache, value_cache, slots)
    ref = torch_ops.paged_decode_attention(q, ref_kc, ref_vc, block_tables, lens, 0.25)
    out = kernels.paged_decode_attention(q, key_cache, value_cache, block_tables, lens, 0.25)
    torch.testing.assert_close(out, ref, **TOL)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision(dtype):
    """16-bit caches and queries: fp32 accumulation, output in the query dtype."""
    gen = _gen(8)
    bs, num_heads, num_kv_heads, head_dim = 16, 4, 2, 32
    seq_lens, starts = [9, 17, 61], [0, 5, 22, 62]  # query lengths 5, 17, 40
    key_cache, value_cache = _caches(12, num_kv_heads, bs, head_dim, gen, dtype=dtype)
    block_tables = _block_tables(seq_lens, bs, 12, gen)
    query = _randn(starts[-1], num_heads, head_dim, gen=gen, dtype=dtype)
    qsl = torch.tensor(starts, device=DEVICE, dtype=torch.int32)
    lens = torch.tensor(seq_lens, device=DEVICE, dtype=torch.int32)
    f32 = [t.float() for t in (query, key_cache, value_cache)]
    tol = {"atol": 1e-2, "rtol": 1e-2} if dtype == torch.bfloat16 else {"atol": 2e-3, "rtol": 2e-3}

    ref = torch_ops.paged_prefill_attention(*f32, block_tables, qsl, lens, 0.2)
    out = kernels.paged_prefill_attention(
        query, key_cache, value_cache, block_tables, qsl, lens, 0.2
    )
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), ref, **tol)

    decode_q = query[qsl[1:].long() - 1]  # each sequence's last token
    ref = torch_ops.paged_decode_attention(
        f32[0][qsl[1:].long() - 1], *f32[1:], block_tables, lens, 0.2
    )
    out = kernels.paged_decode_attention(decode_q, key_cache, value_cache, block_tables, lens, 0.2)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), ref, **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_default_tiles_above_head_dim_128(dtype):
    """The launchers' own tiles at head dim 160 (padded to 256): prefill 16 x 16
    (rows x keys) for fp32 queries, decode 32 keys per tile for 16-bit dots;
    several tiles per sequence, every option on, GQA group 4."""
    gen = _gen(9)
    bs, num_heads, num_kv_heads, head_dim = 16, 4, 1, 160
    seq_lens, starts = [70, 40], [0, 35, 38]  # 35 new over 35 cached; 3 over 37
    num_blocks = sum(-(-n // bs) for n in seq_lens) + 2
    key_cache, value_cache = _caches(num_blocks, num_kv_heads, bs, head_dim, gen, dtype=dtype)
    block_tables = _block_tables(seq_lens, bs, num_blocks, gen)
    query = _randn(starts[-1], num_heads, head_dim, gen=gen, dtype=dtype)
    qsl = torch.tensor(starts, device=DEVICE, dtype=torch.int32)
    lens = torch.tensor(seq_lens, device=DEVICE, dtype=torch.int32)
    kw = _features({"sliding_window": 45, "softcap": 2.5, "sinks": True}, num_heads, gen)
    f32 = [t.float() for t in (query, key_cache, value_cache)]
    tol = TOL if dtype == torch.float32 else {"atol": 2e-3, "rtol": 2e-3}

    ref = torch_ops.paged_prefill_attention(*f32, block_tables, qsl, lens, 0.1, **kw)
    out = kernels.paged_prefill_attention(
        query, key_cache, value_cache, block_tables, qsl, lens, 0.1, **kw
    )
    torch.testing.assert_close(out.float(), ref, **tol)

    last = qsl[1:].long() - 1  # each sequence's last token
    ref = torch_ops.paged_decode_attention(f32[0][last], *f32[1:], block_tables, lens, 0.1, **kw)
    out = kernels.paged_decode_attention(
        query[last], key_cache, value_cache, block_tables, lens, 0.1, **kw
    )
    torch.testing.assert_close(out.float(), ref, **tol)


FEATURES = {
    "window": {"sliding_window": 5},
    "window_wide": {"sliding_window": 23},
    "softcap": {"softcap": 0.9},
    "sinks": {"sinks": True},
    "all": {"sliding_window": 7, "softcap": 2.5, "sinks": True},
}


def _features(opts, num_heads, gen):
    kw = dict(opts)
    if kw.get("sinks"):
        kw["sinks"] = _randn(num_heads, gen=gen) * 2
    return kw


@pytest.mark.parametrize("opts", list(FEATURES.values()), ids=list(FEATURES))
@pytest.mark.parametrize("tiles", [(32, 16), (16, 16)])
def test_prefill_attention_features(opts, tiles):
    """Window, soft cap and sinks over a cached prefix with tiles of fewer keys
    than rows, so some rows see none of a tile's first keys (window)."""
    gen = _gen(21)
    bs, num_heads, num_kv_heads, head_dim = 4, 4, 2, 16
    seq_lens, starts = [45, 9, 3], [0, 40, 41, 44]  # 40 new over 5 cached; a decode; a prompt
    num_blocks = sum(-(-n // bs) for n in seq_lens) + 2
    key_cache, value_cache = _caches(num_blocks, num_kv_heads, bs, head_dim, gen)
    block_tables = _block_tables(seq_lens, bs, num_blocks, gen)
    query = _randn(starts[-1], num_heads, head_dim, gen=gen)
    qsl = torch.tensor(starts, device=DEVICE, dtype=torch.int32)
    lens = torch.tensor(seq_lens, device=DEVICE, dtype=torch.int32)
    kw = _features(opts, num_heads, gen)
    args = (query, key_cache, value_cache, block_tables, qsl, lens, 0.3)
    ref = torch_ops.paged_prefill_attention(*args, **kw)
    out = kernels.paged_prefill_attention(*args, block_m=tiles[0], block_n=tiles[1], **kw)
    torch.testing.assert_close(out, ref, **TOL)


@pytest.mark.parametrize("opts", list(FEATURES.values()), ids=list(FEATURES))
def test_decode_attention_features(opts):
    gen = _gen(22)
    bs, num_heads, num_kv_heads, head_dim = 4, 4, 2, 16
    seq_lens = [1, 6, 37, 23]
    num_blocks = sum(-(-n // bs) for n in seq_lens) + 2
    key_cache, value_cache = _caches(num_blocks, num_kv_heads, bs, head_dim, gen)
    block_tables = _block_tables(seq_lens, bs, num_blocks, gen)
    query = _randn(len(seq_lens), num_heads, head_dim, gen=gen)
    lens = torch.tensor(seq_lens, device=DEVICE, dtype=torch.int32)
    kw = _features(opts, num_heads, gen)
    args = (query, key_cache, value_cache, block_tables, lens, 0.3)
    ref = torch_ops.paged_decode_attention(*args, **kw)
    out = kernels.paged_decode_attention(*args, block_n=16, **kw)
    torch.testing.assert_close(out, ref, **TOL)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_features(dtype):
    gen = _gen(23)
    bs, num_heads, num_kv_heads, head_dim = 16, 4, 2, 32
    seq_lens, starts = [9, 61], [0, 5, 45]
    key_cache, value_cache = _caches(8, num_kv_heads, bs, head_dim, gen, dtype=dtype)
    block_tables = _block_tables(seq_lens, bs, 8, gen)
    query = _randn(starts[-1], num_heads, head_dim, gen=gen, dtype=dtype)
    qsl = torch.tensor(starts, device=DEVICE, dtype=torch.int32)
    lens = torch.tensor(seq_lens, device=DEVICE, dtype=torch.int32)
    kw = _features(FEATURES["all"], num_heads, gen)
    f32 = [t.float() for t in (query, key_cache, value_cache)]
    tol = {"atol": 1e-2, "rtol": 1e-2} if dtype == torch.bfloat16 else {"atol": 2e-3, "rtol": 2e-3}
    ref = torch_ops.paged_prefill_attention(*f32, block_tables, qsl, lens, 0.2, **kw)
    out = kernels.paged_prefill_attention(
        query, key_cache, value_cache, block_tables, qsl, lens, 0.2, **kw
    )
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), ref, **tol)
    last = qsl[1:].long() - 1
    ref = torch_ops.paged_decode_attention(f32[0][last], *f32[1:], block_tables, lens, 0.2, **kw)
    out = kernels.paged_decode_attention(
        query[last], key_cache, value_cache, block_tables, lens, 0.2, **kw
    )
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), ref, **tol)


@pytest.mark.parametrize("num_layers", [1, 3])
def test_copy_blocks(num_layers):
    gen = _gen(6)
    shape = (10, 2, 8, 24)
    key_caches = [_randn(*shape, gen=gen) for _ in range(num_layers)]
    value_caches = [_randn(*shape, gen=gen) for _ in range(num_layers)]
    # Sources may repeat; destinations are distinct and never sources.
    mapping = torch.tensor([[0, 7], [3, 5], [0, 9], [2, 1]], device=DEVICE, dtype=torch.int64)

    ref_k = [c.clone() for c in key_caches]
    ref_v = [c.clone() for c in value_caches]
    src, dst = mapping[:, 0], mapping[:, 1]
    for cache in ref_k + ref_v:
        cache[dst] = cache[src]
    kernels.copy_blocks(key_caches, value_caches, mapping)
    for got, want in zip(key_caches + value_caches, ref_k + ref_v, strict=True):
        torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_copy_blocks_empty_mapping():
    gen = _gen(7)
    cache = _randn(4, 1, 8, 16, gen=gen)
    before = cache.clone()
    empty = torch.empty(0, 2, device=DEVICE, dtype=torch.int64)
    kernels.copy_blocks([cache], [cache.clone()], empty)
    torch.testing.assert_close(cache, before, atol=0, rtol=0)


@pytest.mark.parametrize("num_splits", [1, 2, 4, 8])
@pytest.mark.parametrize("group", [1, 3, 4, 8])
def test_decode_attention_splits_and_gqa(num_splits, group):
    """One program per (sequence, KV head) serving its whole query group, the
    context split over programs and the splits combined; splits may be empty
    (short sequences) or end mid-block."""
    gen = _gen(30 + group)
    bs, num_kv_heads, head_dim = 16, 2, 16
    seq_lens = [1, 15, 33, 100, 161]
    num_blocks = sum(-(-n // bs) for n in seq_lens) + 3
    key_cache, value_cache = _caches(num_blocks, num_kv_heads, bs, head_dim, gen)
    block_tables = _block_tables(seq_lens, bs, num_blocks, gen)
    query = _randn(len(seq_lens), group * num_kv_heads, head_dim, gen=gen)
    lens = torch.tensor(seq_lens, device=DEVICE, dtype=torch.int32)
    args = (query, key_cache, value_cache, block_tables, lens, 0.3)
    ref = torch_ops.paged_decode_attention(*args)
    out = kernels.paged_decode_attention(*args, block_n=32, num_splits=num_splits)
    torch.testing.assert_close(out, ref, **TOL)


@pytest.mark.parametrize("opts", list(FEATURES.values()), ids=list(FEATURES))
def test_decode_attention_features_with_splits(opts):
    """Window, soft cap and sinks across splits: the sink is counted once, when
    the splits are combined; splits wholly before the window hold nothing."""
    gen = _gen(40)
    bs, num_heads, num_kv_heads, head_dim = 8, 6, 2, 16
    seq_lens = [1, 6, 37, 90]
    num_blocks = sum(-(-n // bs) for n in seq_lens) + 2
    key_cache, value_cache = _caches(num_blocks, num_kv_heads, bs, head_dim, gen)
    block_tables = _block_tables(seq_lens, bs, num_blocks, gen)
    query = _randn(len(seq_lens), num_heads, head_dim, gen=gen)
    lens = torch.tensor(seq_lens, device=DEVICE, dtype=torch.int32)
    kw = _features(opts, num_heads, gen)
    args = (query, key_cache, value_cache, block_tables, lens, 0.3)
    ref = torch_ops.paged_decode_attention(*args, **kw)
    out = kernels.paged_decode_attention(*args, block_n=16, num_splits=4, **kw)
    torch.testing.assert_close(out, ref, **TOL)


@pytest.mark.parametrize("kv", ["int8", "fp8_e5m2", "bfloat16"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_decode_attention_kv_formats_with_splits(kv, dtype):
    """Narrow KV formats (int8 scales applied after the dots) with 16-bit queries
    (dots in the query dtype where the cache converts exactly) and splits."""
    from pagedrs.attention.kv_cache_dtype import FORMATS, dequantize, quantize

    gen = _gen(41)
    bs, num_heads, num_kv_heads, head_dim = 16, 8, 2, 32
    seq_lens = [3, 40, 75]
    num_blocks = sum(-(-n // bs) for n in seq_lens) + 2
    storage = FORMATS[kv].storage
    caches = [
        quantize(torch.randn(num_blocks, num_kv_heads, bs, head_dim, generator=gen), storage)
        for _ in range(2)
    ]
    block_tables = _block_tables(seq_lens, bs, num_blocks, gen)
    query = _randn(len(seq_lens), num_heads, head_dim, gen=gen, dtype=dtype)
    lens = torch.tensor(seq_lens, device=DEVICE, dtype=torch.int32)
    wide = [dequantize(c, torch.float32).to(DEVICE) for c in caches]
    ref = torch_ops.paged_decode_attention(query.float(), *wide, block_tables, lens, 0.2)
    out = kernels.paged_decode_attention(
        query, *(c.to(DEVICE) for c in caches), block_tables, lens, 0.2, num_splits=2
    )
    assert out.dtype == dtype
    tol = TOL if dtype == torch.float32 else {"atol": 2e-3, "rtol": 2e-3}
    torch.testing.assert_close(out.float(), ref, **tol)


def test_default_num_splits_depends_on_shapes_only(monkeypatch):
    from pagedrs.kernels import launch_config

    assert launch_config.default_num_splits(4, 8, 32768, torch.device("cpu")) == 1

    class Props:
        multi_processor_count = 132

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: Props())
    cuda = torch.device("cuda")
    # 4 x 8 programs for 132 SMs: 9 wanted, a power of two.
    assert launch_config.default_num_splits(4, 8, 32768, cuda) == 16
    assert launch_config.default_num_splits(256, 8, 32768, cuda) == 1  # enough programs already
    assert launch_config.default_num_splits(1, 1, 1 << 20, cuda) == launch_config.MAX_SPLITS
    assert launch_config.default_num_splits(1, 8, 512, cuda) == 2  # at most one per 256 tokens
