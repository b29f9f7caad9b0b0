"""The rejection rule of a draft model (Leviathan et al. 2023, Algorithm 1):
each emitted token is distributed as the target's ``p`` whatever the draft's
``q``. Chi-square tests over many draws on a tiny vocabulary, of the rule
alone and through the sampler (temperature, top-k, seeded rows), at a
significance of 0.001 with fixed seeds (deterministic)."""

from __future__ import annotations

import numpy as np
import torch
from pagedrs.executor.sampler import Sampler
from pagedrs.spec_decode.rejection import DraftRows, rejection_tokens
from pagedrs.spec_decode.verify import SampleRows

#: Chi-square critical values at significance 0.001 by degrees of freedom.
CHI2_001 = {3: 16.266, 4: 18.467, 5: 20.515}


def _chi2(counts: np.ndarray, probs: np.ndarray) -> float:
    n = counts.sum()
    expected = n * probs
    live = expected > 0
    assert counts[~live].sum() == 0, "a token of probability 0 was drawn"
    return float(((counts[live] - expected[live]) ** 2 / expected[live]).sum())


def test_emitted_tokens_follow_p() -> None:
    """One draft position: the token (the draft kept, or the correction from
    norm(max(0, p - q))) is a draw of p, for a q far from p; and the
    acceptance rate is sum(min(p, q)) (Leviathan et al., Theorem 3.5)."""
    gen = torch.Generator().manual_seed(0)
    p = torch.tensor([0.05, 0.40, 0.25, 0.0, 0.20, 0.10])
    q = torch.tensor([0.30, 0.05, 0.25, 0.20, 0.10, 0.10])
    m = 200_000
    draft = torch.multinomial(q, m, replacement=True, generator=gen)
    uniform = torch.rand(m, generator=gen)
    noise = torch.empty(m, len(p)).exponential_(generator=gen)
    out = rejection_tokens(p.expand(m, -1), q.expand(m, -1), draft, uniform, noise)
    counts = np.bincount(out.numpy(), minlength=len(p))
    assert _chi2(counts, p.numpy()) < CHI2_001[4]  # p has 5 live tokens
    accepted = float((out == draft).float().mean())
    assert abs(accepted - float(torch.minimum(p, q).sum())) < 0.005
    # A rejected draft never comes back as the correction.
    rejected = uniform * q[draft] >= p[draft]
    assert not bool((out[rejected] == draft[rejected]).any())


def test_equal_distributions_accept_every_draft() -> None:
    gen = torch.Generator().manual_seed(1)
    p = torch.tensor([0.1, 0.2, 0.3, 0.4])
    m = 10_000
    draft = torch.multinomial(p, m, replacement=True, generator=gen)
    out = rejection_tokens(
        p.expand(m, -1),
        p.expand(m, -1),
        draft,
        torch.rand(m, generator=gen),
        torch.empty(m, 4).exponential_(generator=gen),
    )
    assert torch.equal(out, draft)


def _rows(n: int, temperature: float, top_k: int, seed: int) -> SampleRows:
    return SampleRows(
        sample_request_ids=np.arange(n, dtype=np.uint64),
        temperature=np.full(n, temperature, np.float32),
        top_p=np.ones(n, np.float32),
        top_k=np.full(n, top_k, np.int32),
        seed=np.arange(n, dtype=np.int64) + seed if seed >= 0 else np.full(n, -1, np.int64),
        num_output_tokens=np.zeros(n, np.int64),
        num_samples=np.ones(n, np.int32),
    )


def test_sampler_rows_with_drafts_follow_the_target() -> None:
    """Through ``Sampler``: rows of target logits at temperature 0.8 and
    top-k 4, drafts drawn from another distribution; the sampled tokens of
    rows verifying a draft follow the target's processed distribution, for
    unseeded rows (the engine's generator) and seeded ones (one seed per
    row, the acceptance draw keyed by it)."""
    target = torch.tensor([2.0, 1.5, 0.3, -1.0, 0.8, -3.0])
    draft_logits = torch.tensor([0.0, 2.5, 1.0, 0.5, -1.0, 0.2])
    temperature, top_k = 0.8, 4
    p = Sampler._probs(
        target[None], torch.tensor([temperature]), torch.ones(1), torch.tensor([top_k])
    )[0]
    q = torch.softmax(draft_logits / temperature, dim=-1)
    m = 40_000
    for seed in (-1, 1000):
        gen = torch.Generator().manual_seed(7)
        drafts = torch.multinomial(q, m, replacement=True, generator=gen).numpy()
        sampler = Sampler(seed=3)
        out = sampler(
            target.expand(m, -1).clone(),
            _rows(m, temperature, top_k, seed),
            drafts=DraftRows(drafts.astype(np.int64), q.expand(m, -1).clone()),
        )
        counts = np.bincount(out.token_ids, minlength=len(target))
        assert _chi2(counts, p.numpy()) < CHI2_001[3]  # top-k 4: 4 live tokens
        assert 0 < (out.token_ids == drafts).mean() < 1
