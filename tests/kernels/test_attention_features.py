"""Sliding windows, logit soft caps and attention sinks: the torch reference
against HF transformers' own eager attention functions (Mistral, Gemma2,
gpt-oss) under HF-built masks, and every backend against the torch reference
on decode, mixed and chunked-prefill steps through the backend interface."""

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
from pagedrs.attention.metadata import AttentionMetadata  # noqa: E402
from test_attention_backends import BS, HKV, HQ, D, N, _batch, _device  # noqa: E402
from transformers.masking_utils import (  # noqa: E402
    causal_mask_function,
    sliding_window_causal_mask_function,
)
from transformers.models.gemma2.modeling_gemma2 import (  # noqa: E402
    eager_attention_forward as gemma2_eager,
)
from transformers.models.gpt_oss.modeling_gpt_oss import (  # noqa: E402
    eager_attention_forward as gpt_oss_eager,
)
from transformers.models.mistral.modeling_mistral import (  # noqa: E402
    eager_attention_forward as mistral_eager,
)

TOL = {"atol": 1e-5, "rtol": 1e-5}


class _Module(torch.nn.Module):
    """What HF's eager functions read off the attention module."""

    def __init__(self, sinks: torch.Tensor | None = None) -> None:
        super().__init__()
        self.num_key_value_groups = HQ // HKV
        self.head_dim = D
        if sinks is not None:
            self.sinks = torch.nn.Parameter(sinks)
        self.eval()


def _hf_mask(q_pos: torch.Tensor, ctx: int, window: int | None) -> torch.Tensor:
    """HF's additive mask ``[1, 1, L, C]`` from its own mask functions."""
    fn = causal_mask_function if window is None else sliding_window_causal_mask_function(window)
    allowed = fn(0, 0, q_pos[:, None], torch.arange(ctx)[None, :])
    zero = torch.zeros((), dtype=torch.float32)
    return torch.where(allowed, zero, torch.finfo(torch.float32).min)[None, None]


def _hf(kind: str, q, k, v, mask, scale, softcap, sinks) -> torch.Tensor:
    """HF eager attention of ``q`` ``[L, Hq, D]`` over ``k``/``v`` ``[Hkv, C, D]``."""
    args = (q.transpose(0, 1)[None], k[None], v[None], mask)
    if kind == "mistral":
        out, _ = mistral_eager(_Module(), *args, scaling=scale, dropout=0.0)
    elif kind == "gemma2":
        out, _ = gemma2_eager(_Module(), *args, dropout=0.0, scaling=scale, softcap=softcap)
    else:
        out, _ = gpt_oss_eager(_Module(sinks), *args, scaling=scale, dropout=0.0)
    return out[0]  # [L, Hq, D]


# (HF model whose eager function is the reference, window, softcap, sinks)
HF_CASES = [
    ("mistral", 5, None, False),
    ("mistral", 1, None, False),
    ("gemma2", None, 2.0, False),
    ("gemma2", 4, 0.5, False),
    ("gpt_oss", None, None, True),
    ("gpt_oss", 6, None, True),
]


@pytest.mark.parametrize(("kind", "window", "softcap", "with_sinks"), HF_CASES)
@pytest.mark.parametrize(("ctx", "q_len"), [(13, 13), (13, 5), (13, 1)])
def test_torch_reference_matches_hf_eager(kind, window, softcap, with_sinks, ctx, q_len):
    gen = torch.Generator().manual_seed(ctx * 10 + q_len)
    q = torch.randn(q_len, HQ, D, generator=gen)
    k, v = torch.randn(HKV, ctx, D, generator=gen), torch.randn(HKV, ctx, D, generator=gen)
    sinks = torch.randn(HQ, generator=gen) * 2 if with_sinks else None
    scale = 0.7  # not D ** -0.5: the scale is the model's (e.g. query_pre_attn_scalar)
    mask = _hf_mask(torch.arange(ctx - q_len, ctx), ctx, window)
    want = _hf(kind, q, k, v, mask, scale, softcap, sinks)
    opts = {"sliding_window": window, "softcap": softcap, "sinks": sinks}
    got = torch_ops.causal_prefix_attention(q, k, v, scale, **opts)
    torch.testing.assert_close(got, want, **TOL)
    if q_len == 1:
        # The paged decode path: the same context through a shuffled block table.
        blocks = -(-ctx // BS)
        table = torch.randperm(N, generator=gen)[:blocks].to(torch.int32)[None]
        kc, vc = torch.zeros(N, HKV, BS, D), torch.zeros(N, HKV, BS, D)
        for t in range(ctx):
            kc[table[0, t // BS], :, t % BS] = k[:, t]
            vc[table[0, t // BS], :, t % BS] = v[:, t]
        lens = torch.tensor([ctx], dtype=torch.int32)
        got = torch_ops.paged_decode_attention(q, kc, vc, table, lens, scale, **opts)
        torch.testing.assert_close(got, want, **TOL)


def test_window_hides_exactly_the_older_tokens():
    # HF 5.x: the query at position p sees p - W < k <= p (W tokens, itself included).
    allowed = sliding_window_causal_mask_function(3)(0, 0, torch.tensor([[5]]), torch.arange(8))
    assert allowed[0].nonzero().flatten().tolist() == [3, 4, 5]
    mask = torch_ops.visible_mask(torch.tensor([5]), 8, None, 3)
    assert mask[0].nonzero().flatten().tolist() == [3, 4, 5]


# Steps: (cached tokens, new tokens) per sequence. "long" prompts exceed the
# window; "chunk" is a prefill chunk over a cached prefix straddling the window.
STEPS = {
    "decode": ([0, 3, 9, 13], [1, 1, 1, 1]),
    "mixed": ([0, 5, 2, 7], [11, 1, 3, 1]),
    "chunk": ([9], [6]),
}
OPTIONS = {
    "window": {"sliding_window": 4},
    "window1": {"sliding_window": 1},
    "softcap": {"softcap": 1.5},
    "sinks": {"sinks": True},
    "all": {"sliding_window": 5, "softcap": 0.8, "sinks": True},
}


def _run(name, batch, seed, opts):
    gen = torch.Generator().manual_seed(seed)
    kc, vc = torch.randn(N, HKV, BS, D, generator=gen), torch.randn(N, HKV, BS, D, generator=gen)
    t = batch.num_tokens
    q = torch.randn(t, HQ, D, generator=gen)
    k, v = torch.randn(t, HKV, D, generator=gen), torch.randn(t, HKV, D, generator=gen)
    sinks = torch.randn(HQ, generator=gen) * 2
    dev = _device(name)
    kc, vc, q, k, v, sinks = (x.to(dev) for x in (kc, vc, q, k, v, sinks))
    kw = dict(opts)
    if kw.get("sinks"):
        kw["sinks"] = sinks
    meta = AttentionMetadata.from_batch(batch, dev)
    return (
        get_attention_backend(name)
        .forward(q, k, v, kc, vc, meta, AttentionOptions(0.4, **kw))
        .cpu()
    )


@pytest.mark.parametrize("name", sorted(BACKENDS))
@pytest.mark.parametrize("opts", list(OPTIONS.values()), ids=list(OPTIONS))
@pytest.mark.parametrize("step", list(STEPS.values()), ids=list(STEPS))
def test_backend_matches_torch_reference(name, opts, step):
    ctx, new = step
    batch = _batch(ctx, new, torch.Generator().manual_seed(len(ctx)))
    want = _run("torch", batch, 11, opts)
    got = _run(name, batch, 11, opts)
    torch.testing.assert_close(got, want, **TOL)


def test_options_change_the_result_and_are_checked():
    ctx, new = STEPS["mixed"]
    batch = _batch(ctx, new, torch.Generator().manual_seed(4))
    plain = _run("torch", batch, 11, {})
    for opts in OPTIONS.values():
        assert not torch.allclose(_run("torch", batch, 11, opts), plain)
    for bad, match in [
        ({"sliding_window": 0}, "sliding_window"),
        ({"softcap": 0.0}, "softcap"),
        ({"scale": 0.0}, "scale"),
    ]:
        with pytest.raises(ValueError, match=match):
            AttentionOptions(**{"scale": 1.0, **bad})
    backend = get_attention_backend("torch")
    meta = AttentionMetadata.from_batch(batch, torch.device("cpu"))
    q, kv = torch.zeros(batch.num_tokens, HQ, D), torch.zeros(batch.num_tokens, HKV, D)
    caches = torch.zeros(N, HKV, BS, D), torch.zeros(N, HKV, BS, D)
    with pytest.raises(ValueError, match="sinks"):
        backend.forward(q, kv, kv, *caches, meta, AttentionOptions(1.0, sinks=torch.zeros(HQ + 1)))


class _Recorder:
    """A backend stand-in that records what ``forward`` is given."""

    def forward(self, q, k, v, key_cache, value_cache, meta, opts):
        self.opts = opts
        return torch.zeros_like(q)


@pytest.mark.parametrize(
    ("kwargs", "module_window", "want"),
    [
        ({}, None, {"sliding_window": None, "softcap": None}),
        ({"sliding_window": 8}, None, {"sliding_window": 8, "softcap": None}),
        ({"sliding_window": None}, 8, {"sliding_window": None, "softcap": None}),
        ({}, 6, {"sliding_window": 6, "softcap": None}),
        ({"sliding_window": 4, "softcap": 50.0}, None, {"sliding_window": 4, "softcap": 50.0}),
    ],
)
def test_hf_attention_function_passes_options(kwargs, module_window, want):
    from pagedrs.attention.forward_context import ForwardContext, set_forward_context
    from pagedrs.attention.hf_attention import paged_attention_forward

    module = torch.nn.Module()
    module.layer_idx = 0
    if module_window is not None:
        module.sliding_window = module_window
    rec = _Recorder()
    sinks = torch.randn(HQ)
    caches = [(torch.zeros(N, HKV, BS, D), torch.zeros(N, HKV, BS, D))]
    q, kv = torch.zeros(1, HQ, 3, D), torch.zeros(1, HKV, 3, D)
    with set_forward_context(ForwardContext(caches, [None], rec)):
        out, _ = paged_attention_forward(
            module, q, kv, kv, None, scaling=0.125, s_aux=sinks, **kwargs
        )
    assert out.shape == (1, 3, HQ, D)
    assert rec.opts.scale == 0.125
    assert torch.equal(rec.opts.sinks, sinks)
    assert {k: getattr(rec.opts, k) for k in want} == want


# Steps with blocks wholly behind a window of 4 or 5 (a fresh long prompt too).
RELEASE_STEPS = {
    "decode": ([0, 3, 9, 13], [1, 1, 1, 1]),
    "mixed": ([0, 13, 2, 11], [11, 1, 3, 2]),
    "chunk": ([9], [6]),
}


def _release_behind_window(batch, window: int):
    """``batch`` as a sliding-window KV cache group holds it: each sequence's
    blocks wholly behind its first new token's window read 0 (released), and
    no live block is block 0."""
    tables = batch.kv_groups[0].block_tables.copy()
    unused = sorted(set(range(1, N)) - set(tables.flatten().tolist()))
    tables[tables == 0] = unused[0]  # the live block 0, if any, moves
    q_lens = np.diff(batch.query_start_loc)
    first = batch.seq_lens - q_lens  # position of each sequence's first new token
    slots = [
        tables[s, p // BS] * BS + p % BS
        for s, n in enumerate(q_lens.tolist())
        for p in range(first[s], first[s] + n)
    ]
    live = tables.copy()
    for s in range(len(first)):
        start = max(0, int(first[s]) - window + 1)  # the first query's window
        tables[s, : start // BS] = 0
    fields = {
        name: getattr(batch, name)
        for name in (
            "input_ids", "positions", "query_start_loc", "seq_lens", "seq_request_ids",
            "logits_indices", "sample_request_ids", "temperature", "top_p", "top_k", "seed",
            "num_output_tokens", "num_samples",
        )
    }  # fmt: skip

    def make(t):
        return StepBatch(kv_groups=[KVCacheGroupBatch(np.array(slots, np.int64), t)], **fields)

    return make(live), make(tables)


@pytest.mark.parametrize("name", sorted(BACKENDS))
@pytest.mark.parametrize("opts", [OPTIONS["window"], OPTIONS["all"]], ids=["window", "all"])
@pytest.mark.parametrize("step", list(RELEASE_STEPS.values()), ids=list(RELEASE_STEPS))
def test_released_blocks_behind_the_window_get_no_weight(name, opts, step):
    """A sliding-window group's block tables read 0 for the blocks wholly
    behind the window; whatever block 0 holds gets no weight in any backend."""
    ctx, new = step
    window = opts["sliding_window"]
    live, released = _release_behind_window(
        _batch(ctx, new, torch.Generator().manual_seed(len(ctx))), window
    )
    assert (released.kv_groups[0].block_tables == 0).any()
    gen = torch.Generator().manual_seed(5)
    kc, vc = torch.randn(N, HKV, BS, D, generator=gen), torch.randn(N, HKV, BS, D, generator=gen)
    q = torch.randn(live.num_tokens, HQ, D, generator=gen)
    k, v = (torch.randn(live.num_tokens, HKV, D, generator=gen) for _ in range(2))
    sinks = torch.randn(HQ, generator=gen) * 2
    kw = dict(opts)
    if kw.get("sinks"):
        kw["sinks"] = sinks
    want = get_attention_backend("torch").forward(
        q,
        k,
        v,
        kc.clone(),
        vc.clone(),
        AttentionMetadata.from_batch(live, kc.device),
        AttentionOptions(0.4, **kw),
    )
    kc[0], vc[0] = 1e4, -1e4  # never a live block: its weight must be exactly 0
    dev = _device(name)
    kw = {key: val.to(dev) if isinstance(val, torch.Tensor) else val for key, val in kw.items()}
    meta = AttentionMetadata.from_batch(released, dev)
    got = get_attention_backend(name).forward(
        q.to(dev), k.to(dev), v.to(dev), kc.to(dev), vc.to(dev), meta, AttentionOptions(0.4, **kw)
    )
    torch.testing.assert_close(got.cpu(), want, **TOL)
