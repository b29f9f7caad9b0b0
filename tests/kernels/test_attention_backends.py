"""Every attention backend computes the same paged attention as the torch
reference through the one interface the models call (``AttentionBackend``):
K/V writes, a pure decode step, a mixed prefill + decode step over a cached
prefix, copy-on-write block copies and swaps."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from pagedrs._core import KVCacheGroupBatch, StepBatch  # noqa: E402
from pagedrs.attention.backends import (  # noqa: E402
    BACKENDS,
    AttentionOptions,
    get_attention_backend,
)
from pagedrs.attention.kv_cache_dtype import FORMATS  # noqa: E402
from pagedrs.attention.metadata import AttentionMetadata  # noqa: E402

TOL = {"atol": 1e-5, "rtol": 1e-5}
GPU = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def _device(name: str) -> torch.device:
    """Triton runs on the GPU when there is one; the others on the CPU."""
    return GPU if name == "triton" else torch.device("cpu")


BS, HQ, HKV, D, N = 4, 4, 2, 16, 32


def _batch(ctx: list[int], new: list[int], gen: torch.Generator) -> StepBatch:
    """A step where sequence s has ``ctx[s]`` tokens cached and ``new[s]`` new."""
    perm = torch.randperm(N, generator=gen).numpy()
    width = max(-(-(c + n) // BS) for c, n in zip(ctx, new, strict=True))
    tables = np.zeros((len(ctx), width), np.int32)
    slots, positions, used = [], [], 0
    for s, (c, n) in enumerate(zip(ctx, new, strict=True)):
        k = -(-(c + n) // BS)
        tables[s, :k] = perm[used : used + k]
        used += k
        for p in range(c, c + n):
            positions.append(p)
            slots.append(tables[s, p // BS] * BS + p % BS)
    qsl = np.concatenate([[0], np.cumsum(new)]).astype(np.int32)
    s_ids = np.arange(len(ctx))
    return StepBatch(
        input_ids=np.zeros(len(slots), np.int64),
        positions=np.array(positions, np.int64),
        query_start_loc=qsl,
        seq_lens=(np.array(ctx) + np.array(new)).astype(np.int32),
        seq_request_ids=s_ids.astype(np.uint64),
        kv_groups=[KVCacheGroupBatch(np.array(slots, np.int64), tables)],
        logits_indices=(qsl[1:] - 1).astype(np.int64),
        sample_request_ids=s_ids.astype(np.uint64),
        temperature=np.zeros(len(ctx), np.float32),
        top_p=np.ones(len(ctx), np.float32),
        top_k=np.full(len(ctx), -1, np.int32),
        seed=np.full(len(ctx), -1, np.int64),
        num_output_tokens=np.zeros(len(ctx), np.int64),
        num_samples=np.ones(len(ctx), np.int32),
    )


def _run(name: str, batch: StepBatch, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(output, key cache, value cache) of one layer's forward on ``batch``,
    with the context before the step pre-filled with the same random K/V."""
    gen = torch.Generator().manual_seed(seed)
    kc, vc = torch.randn(N, HKV, BS, D, generator=gen), torch.randn(N, HKV, BS, D, generator=gen)
    t = batch.num_tokens
    q = torch.randn(t, HQ, D, generator=gen)
    k, v = torch.randn(t, HKV, D, generator=gen), torch.randn(t, HKV, D, generator=gen)
    dev = _device(name)
    kc, vc, q, k, v = (x.to(dev) for x in (kc, vc, q, k, v))
    meta = AttentionMetadata.from_batch(batch, dev)
    out = get_attention_backend(name).forward(q, k, v, kc, vc, meta, AttentionOptions(D**-0.5))
    return out.cpu(), kc.cpu(), vc.cpu()


@pytest.mark.parametrize("name", sorted(BACKENDS))
@pytest.mark.parametrize(
    ("ctx", "new"),
    [([0, 3, 9], [1, 1, 1]), ([0, 5, 2, 7], [6, 1, 3, 1]), ([8], [5])],
    ids=["decode", "mixed", "chunk"],
)
def test_forward_matches_torch_reference(name: str, ctx: list[int], new: list[int]) -> None:
    batch = _batch(ctx, new, torch.Generator().manual_seed(len(ctx)))
    want, want_k, want_v = _run("torch", batch, seed=7)
    got, got_k, got_v = _run(name, batch, seed=7)
    torch.testing.assert_close(got, want, **TOL)
    assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v)


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_copy_and_swap_blocks(name: str) -> None:
    backend, dev = get_attention_backend(name), _device(name)
    gen = torch.Generator().manual_seed(3)
    shape = (N, HKV, BS, D)
    caches = [
        (torch.randn(*shape, generator=gen).to(dev), torch.randn(*shape, generator=gen).to(dev))
    ]
    before = [(k.clone(), v.clone()) for k, v in caches]
    backend.copy_blocks(caches, torch.tensor([[1, 5], [2, 9]], device=dev))
    for (k, v), (k0, v0) in zip(caches, before, strict=True):
        assert torch.equal(k[5], k0[1]) and torch.equal(v[9], v0[2])
        assert torch.equal(k[0], k0[0])
    host = [(torch.zeros(4, HKV, BS, D), torch.zeros(4, HKV, BS, D))]
    backend.swap_blocks(caches, host, torch.tensor([[5, 0], [9, 3]]))
    assert torch.equal(host[0][0][0], caches[0][0][5].cpu())
    assert torch.equal(host[0][1][3], caches[0][1][9].cpu())


def test_cpu_backend_refuses_what_it_cannot_run() -> None:
    with pytest.raises(ValueError, match="kv_cache_dtype='float16'"):
        get_attention_backend("cpu").check(FORMATS["float16"], torch.float16, torch.device("cpu"))
    with pytest.raises(ValueError, match="attention_backend must be one of"):
        get_attention_backend("flash")
