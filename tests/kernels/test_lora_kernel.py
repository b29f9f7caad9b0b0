"""The Rust gathered LoRA product (``_core.lora_add``) against its torch
reference, the same bits in every variant and for a token alone or in a
batch, and its refusals naming the array."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from lora_reference import lora_add_reference
from pagedrs.lora.kernel import lora_add, lora_isas


def _case(t: int, k: int, n: int, r: int, ranks: list[int], seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    num = len(ranks)
    x = torch.randn(t, k, generator=g)
    a = torch.zeros(num, r, k)
    b = torch.zeros(num, n, r)
    for s, q in enumerate(ranks):
        a[s].view(-1)[: q * k] = torch.randn(q * k, generator=g)
        b[s].view(-1)[: n * q] = torch.randn(n * q, generator=g)
    slots = torch.randint(-1, num, (t,), generator=g).numpy().astype(np.int32)
    scal = np.linspace(0.5, 2.0, num).astype(np.float32)
    return x, a, b, slots, np.array(ranks, dtype=np.int32), scal


@pytest.mark.parametrize(
    ("t", "k", "n", "r"), [(1, 64, 48, 8), (37, 67, 29, 16), (130, 576, 192, 64)]
)
def test_equals_the_torch_reference(t: int, k: int, n: int, r: int) -> None:
    x, a, b, slots, ranks, scal = _case(t, k, n, r, [r, r // 2, 0, 3])
    base = torch.randn(t, n + 5)
    got, want = base.clone(), base.clone().double()
    lora_add(x, got, slots, a, b, ranks, scal, out_col=5)
    lora_add_reference(x.double(), want, slots, a.double(), b.double(), ranks, scal, out_col=5)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-4)
    untouched = (slots < 0) | (ranks[np.maximum(slots, 0)] == 0)
    assert torch.equal(got[torch.from_numpy(untouched)], base[torch.from_numpy(untouched)])
    assert torch.equal(got[:, :5], base[:, :5])


def test_a_token_has_the_same_bits_alone_in_a_batch_and_in_every_variant() -> None:
    x, a, b, slots, ranks, scal = _case(40, 96, 33, 16, [16, 8, 4])
    batch = torch.zeros(40, 33)
    lora_add(x, batch, slots, a, b, ranks, scal)
    for isa in lora_isas():
        again = torch.zeros(40, 33)
        lora_add(x, again, slots, a, b, ranks, scal, isa=isa)
        assert torch.equal(again, batch), isa
    for t in range(40):
        alone = torch.zeros(1, 33)
        lora_add(x[t : t + 1].contiguous(), alone, slots[t : t + 1], a, b, ranks, scal)
        assert torch.equal(alone[0], batch[t])


def test_bad_arrays_are_refused_by_name() -> None:
    x, a, b, slots, ranks, scal = _case(4, 16, 8, 4, [4])
    out = torch.zeros(4, 8)
    with pytest.raises(ValueError, match="lora_a"):
        lora_add(x, out, slots, a[:, :, :8].contiguous(), b, ranks, scal)
    with pytest.raises(ValueError, match="token slot 3"):
        lora_add(x, out, np.array([0, 3, 0, 0], np.int32), a, b, ranks, scal)
    with pytest.raises(ValueError, match="rank 9"):
        lora_add(x, out, slots, a, b, np.array([9], np.int32), scal)
    with pytest.raises(ValueError, match="out holds"):
        lora_add(x, out, slots, a, b, ranks, scal, out_col=1)
    with pytest.raises(ValueError, match="not one this CPU runs"):
        lora_add(x, out, slots, a, b, ranks, scal, isa="sve")
