"""The Rust CPU attention kernels (pagedrs._core via the "cpu" attention
backend) against the torch reference (attention.torch_ops)."""

import pytest
import torch
from pagedrs.attention import torch_ops
from pagedrs.attention.backends.cpu import CpuBackend
from pagedrs.attention.kv_cache_dtype import FORMATS
from pagedrs.attention.options import AttentionOptions

CPU = CpuBackend()
TOL = {"atol": 2e-6, "rtol": 1e-5}


def _tables(seq_lens: list[int], bs: int, num_blocks: int, gen: torch.Generator) -> torch.Tensor:
    """Shuffled disjoint blocks per sequence; padding entries hold random valid ids."""
    need = [-(-n // bs) for n in seq_lens]
    perm = torch.randperm(num_blocks, generator=gen)
    table = torch.randint(0, num_blocks, (len(seq_lens), max(need) + 2), generator=gen)
    used = 0
    for s, n in enumerate(need):
        table[s, :n] = perm[used : used + n]
        used += n
    return table.int()


@pytest.mark.parametrize("block_size", [1, 8, 16, 32])
@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim"), [(9, 3, 64), (4, 4, 32), (8, 2, 24)]
)
@pytest.mark.parametrize("num_threads", [1, 2])
def test_decode_matches_torch(block_size, num_heads, num_kv_heads, head_dim, num_threads):
    gen = torch.Generator().manual_seed(block_size * 100 + head_dim)
    seq_lens = [1, block_size - 1 or 1, block_size, block_size + 1, 3 * block_size + 5, 97]
    num_blocks = sum(-(-n // block_size) for n in seq_lens) + 7
    shape = (num_blocks, num_kv_heads, block_size, head_dim)
    kc, vc = torch.randn(*shape, generator=gen), torch.randn(*shape, generator=gen)
    q = torch.randn(len(seq_lens), num_heads, head_dim, generator=gen)
    tables = _tables(seq_lens, block_size, num_blocks, gen)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    threads = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        got = CPU.decode(q, kc, vc, tables, lens, AttentionOptions(head_dim**-0.5))
    finally:
        torch.set_num_threads(threads)
    want = torch_ops.paged_decode_attention(q, kc, vc, tables, lens, head_dim**-0.5)
    torch.testing.assert_close(got, want, **TOL)


def test_decode_large_scores_stay_finite():
    """Scores far apart (one dominant token) give that token's value, no NaN."""
    kc = torch.zeros(2, 1, 4, 8)
    vc = torch.arange(64, dtype=torch.float32).reshape(2, 1, 4, 8)
    kc[1, 0, 2] = 50.0
    q = torch.full((1, 1, 8), 10.0)
    out = CPU.decode(
        q,
        kc,
        vc,
        torch.tensor([[0, 1]], dtype=torch.int32),
        torch.tensor([7], dtype=torch.int32),
        AttentionOptions(1.0),
    )
    torch.testing.assert_close(out[0, 0], vc[1, 0, 2])


def test_write_kv_matches_torch():
    gen = torch.Generator().manual_seed(0)
    shape = (6, 3, 4, 16)
    k, v = torch.randn(5, 3, 16, generator=gen), torch.randn(5, 3, 16, generator=gen)
    slots = torch.tensor([0, 7, -1, 23, 9])
    caches = [torch.zeros(shape) for _ in range(4)]
    CPU.write_kv(k, v, caches[0], caches[1], slots)
    torch_ops.write_kv(k, v, caches[2], caches[3], slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])


def test_bad_inputs_raise_value_error():
    kc, vc = torch.zeros(4, 1, 4, 8), torch.zeros(4, 1, 4, 8)
    q = torch.zeros(1, 2, 8)
    ok_table = torch.tensor([[0, 1]], dtype=torch.int32)
    with pytest.raises(ValueError, match="outside its block table"):
        CPU.decode(q, kc, vc, ok_table, torch.tensor([9], dtype=torch.int32), AttentionOptions(1.0))
    with pytest.raises(ValueError, match="outside the cache"):
        CPU.decode(
            q,
            kc,
            vc,
            torch.tensor([[0, 4]], dtype=torch.int32),
            torch.tensor([6], dtype=torch.int32),
            AttentionOptions(1.0),
        )
    with pytest.raises(ValueError, match="inconsistent shapes"):
        CPU.decode(
            torch.zeros(1, 2, 4),
            kc,
            vc,
            ok_table,
            torch.tensor([2], dtype=torch.int32),
            AttentionOptions(1.0),
        )
    with pytest.raises(ValueError, match="outside the cache"):
        CPU.write_kv(torch.zeros(1, 1, 8), torch.zeros(1, 1, 8), kc, vc, torch.tensor([16]))
    with pytest.raises(ValueError, match="kv_cache_dtype='float16'"):
        CPU.check(FORMATS["float16"], torch.float16, torch.device("cpu"))
