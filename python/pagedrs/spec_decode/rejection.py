"""Speculative sampling with a draft model: the rejection rule of Leviathan et
al., "Fast Inference from Transformers via Speculative Decoding" (ICML 2023,
Algorithm 1 and Theorem 3.5; Chen et al. 2023 give the same rule).

A draft token ``x`` drawn from the draft model's distribution ``q`` is kept
with probability ``min(1, p(x) / q(x))``, ``p`` the target's distribution at
its position; at the first rejection the position's token is drawn from
``norm(max(0, p - q))`` instead, and the drafts after it are dropped; when
every draft is kept the token after them is drawn from ``p`` (the bonus).
Each emitted token is then distributed exactly as ``p`` given the tokens
before it, whatever ``q`` is. For greedy rows ``p`` and ``q`` are point masses
at the argmaxes, and the rule is "accept while equal" (``verify``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class DraftRows:
    """The drafts of a verify step, aligned with its position rows
    (``verify.VerifyPlan.rows``, ``N = R + D``).

    Attributes:
        token_ids: int64 ``[N]`` the draft token a position row verifies (the
            row's j-th position verifies draft j + 1), -1 on rows that verify
            none (a row's last position, rows without drafts).
        probs: float32 ``[N, V]`` the draft distribution ``q`` each draft of a
            sampling row (temperature > 0) was drawn from; other rows are
            unused. None when no sampling row has drafts.
    """

    token_ids: np.ndarray
    probs: torch.Tensor | None


def rejection_tokens(
    p: torch.Tensor,
    q: torch.Tensor,
    draft: torch.Tensor,
    uniform: torch.Tensor,
    noise: torch.Tensor,
) -> torch.Tensor:
    """The token each draft position emits under the rejection rule, one
    position per row (the positions of a run are independent given their
    drafts, so each is decided on its own; the run ends at the first row
    whose token is not its draft, ``verify.VerifyPlan.verify``).

    Args:
        p: float32 ``[M, V]`` the target's probabilities at each position (the
            request's sampling settings applied).
        q: float32 ``[M, V]`` the draft's probabilities the draft was drawn from.
        draft: int64 ``[M]`` the draft token of each position (``q[i, x] > 0``).
        uniform: float32 ``[M]`` one uniform draw in [0, 1) per position.
        noise: float32 ``[M, V]`` independent Exp(1) draws per position and
            token (the exponential race draws token ``i`` of weights ``w``
            as ``argmax w_i / E_i``, with probability ``w_i / sum(w)``).
    Returns:
        int64 ``[M]``: ``draft[i]`` when ``uniform[i] * q[i, x] < p[i, x]``
        (probability ``min(1, p(x) / q(x))``), else a draw of
        ``norm(max(0, p[i] - q[i]))``, which is never ``draft[i]`` (a rejected
        ``x`` has ``p(x) < q(x)``).
    """
    idx = draft[:, None]
    px = p.gather(1, idx)[:, 0]
    qx = q.gather(1, idx)[:, 0]
    accept = uniform * qx < px
    residual = (p - q).clamp(min=0.0)
    residual.scatter_(1, idx, 0.0)  # exactly 0 already; kept so for rounding
    empty = residual.sum(dim=-1) <= 0
    if bool(empty.any()):
        # p <= q everywhere but at x: only rounding gets here (p and q both
        # sum to 1); draw from p without x.
        fallback = p.scatter(1, idx, 0.0)
        residual = torch.where(empty[:, None], fallback, residual)
    corrected = (residual / noise).max(dim=-1).indices
    return torch.where(accept, draft, corrected)
