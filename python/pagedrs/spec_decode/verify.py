"""The verify step of speculative decoding: one sampling row per verified
position, and the acceptance rule.

A row ``r`` of a step with ``d = num_draft_tokens[r]`` drafts ran the model
on ``d + 1`` positions (its pending verified token, then the drafts); the
executor returns the logits of ``spec_logits_indices``, ``d + 1`` rows for
it: the j-th predicts the token after the pending token and the first ``j``
drafts. Each of those logits rows becomes a *position row* of its own, with
the request's settings and ``num_output_tokens + j`` (the sampler's seeded
noise is keyed by (seed, child, position), and ``min_tokens`` counts
positions), so the sampler picks at position ``j`` exactly the token a step
without speculation would pick there once the first ``j`` drafts are the
sequence's tokens. The drafts are accepted while each equals the target's
token at its position; the target's token after the accepted ones (the
bonus, or the correction at the first mismatch) ends the run. Greedy, seeded
and unseeded sampling are all exact: every emitted token is the target's own
sample given the verified tokens before it (the Leviathan et al. rule with a
draft distribution that is a point mass reduces to this).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._core import StepBatch


@dataclass
class SampleRows:
    """The sampler's per-row settings (the fields of ``StepBatch`` it reads),
    one row per logits row.

    Attributes:
        sample_request_ids: uint64 ``[N]`` the row's sequence.
        temperature, top_p: float32 ``[N]``.
        top_k: int32 ``[N]``.
        seed: int64 ``[N]`` (-1: none).
        num_output_tokens: int64 ``[N]`` output tokens before the row's position.
        num_samples: int32 ``[N]`` samples the row draws.
    """

    sample_request_ids: np.ndarray
    temperature: np.ndarray
    top_p: np.ndarray
    top_k: np.ndarray
    seed: np.ndarray
    num_output_tokens: np.ndarray
    num_samples: np.ndarray


@dataclass
class VerifyPlan:
    """The position rows of a step with drafts (``R`` batch rows, ``D``
    drafts, ``N = R + D`` position rows, ``K = sum(num_samples) + D`` samples).

    Attributes:
        rows: the position rows, in the order of ``batch.spec_logits_indices``.
        first_sample: int64 ``[R]`` each batch row's first sample index.
        num_draft_tokens: int64 ``[R]``.
        drafts: per batch row, its draft token ids.
        pending: per position row, the drafts before its position (they join
            the output tokens the penalties count).
        last_row: int64 ``[R]`` each batch row's last position row (its logits
            are those of ``batch.logits_indices``).
    """

    rows: SampleRows
    first_sample: np.ndarray
    num_draft_tokens: np.ndarray
    drafts: list[list[int]]
    pending: list[list[int]]
    last_row: np.ndarray

    @classmethod
    def from_batch(cls, batch: StepBatch) -> VerifyPlan:
        """The position rows of ``batch`` (a step with ``num_drafts > 0``)."""
        nd = batch.num_draft_tokens.astype(np.int64)
        per_row = nd + 1
        rep = np.repeat(np.arange(len(nd)), per_row)
        offset = np.arange(len(rep)) - np.repeat(np.cumsum(per_row) - per_row, per_row)
        ns = batch.num_samples
        if bool(((nd > 0) & (ns != 1)).any()):
            raise ValueError("a row with draft tokens samples more than once")
        rows = SampleRows(
            sample_request_ids=batch.sample_request_ids[rep],
            temperature=batch.temperature[rep],
            top_p=batch.top_p[rep],
            top_k=batch.top_k[rep],
            seed=batch.seed[rep],
            num_output_tokens=batch.num_output_tokens[rep] + offset,
            num_samples=np.where(offset > 0, 1, ns[rep]).astype(np.int32),
        )
        flat = batch.draft_token_ids.tolist()
        starts = np.cumsum(nd) - nd
        drafts = [flat[s : s + d] for s, d in zip(starts.tolist(), nd.tolist(), strict=True)]
        pending = [drafts[r][:j] for r, j in zip(rep.tolist(), offset.tolist(), strict=True)]
        samples = ns.astype(np.int64) + nd
        return cls(
            rows=rows,
            first_sample=np.cumsum(samples) - samples,
            num_draft_tokens=nd,
            drafts=drafts,
            pending=pending,
            last_row=np.cumsum(per_row) - 1,
        )

    def verify(self, tokens: np.ndarray) -> Verified:
        """Accept each row's drafts while they equal the target's tokens.

        Args:
            tokens: int64 ``[K]`` the sampled token of every position row
                (rows without drafts: their ``num_samples`` tokens).
        Returns:
            the accepted counts and each row's run of samples.
        """
        nd = self.num_draft_tokens
        accepted = np.zeros(len(nd), dtype=np.int64)
        for r in np.nonzero(nd)[0].tolist():
            s = int(self.first_sample[r])
            a = 0
            for draft in self.drafts[r]:
                if int(tokens[s + a]) != draft:
                    break
                a += 1
            accepted[r] = a
        return Verified(accepted, self.first_sample, tokens)


@dataclass
class Verified:
    """A verify step's outcome.

    Attributes:
        num_accepted: int64 ``[R]`` drafts accepted per batch row.
        first_sample: int64 ``[R]`` each row's first sample index.
        tokens: int64 ``[K]`` the position rows' sampled tokens.
    """

    num_accepted: np.ndarray
    first_sample: np.ndarray
    tokens: np.ndarray

    def run(self, row: int) -> range:
        """Sample indices of a drafted row's emitted tokens: its accepted
        drafts (equal to the target's tokens there), then the target's token
        after them."""
        s = int(self.first_sample[row])
        return range(s, s + int(self.num_accepted[row]) + 1)

    def update_tokens(self, own: np.ndarray, num_samples: np.ndarray) -> np.ndarray:
        """``Scheduler.update``'s ``sampled``: per row its accepted drafts, then
        its ``num_samples`` tokens from ``own`` (the batch's own samples, as
        beam search may have changed them: a drafted row's is its token after
        the accepted drafts).

        Args:
            own: int64 ``[sum(num_samples)]``.
            num_samples: int32 ``[R]``.
        """
        out: list[int] = []
        k = 0
        for r, ns in enumerate(num_samples.tolist()):
            a = int(self.num_accepted[r])
            if a:
                s = int(self.first_sample[r])
                out.extend(self.tokens[s : s + a].tolist())
            out.extend(own[k : k + ns].tolist())
            k += ns
        return np.asarray(out, dtype=np.int64)

    def own_tokens(self, num_samples: np.ndarray) -> np.ndarray:
        """int64 ``[sum(num_samples)]``: the batch's own samples, one per
        sample of each row: a drafted row's is the target's token after its
        accepted drafts; the others' are their samples."""
        out: list[int] = []
        for r, ns in enumerate(num_samples.tolist()):
            s = int(self.first_sample[r]) + int(self.num_accepted[r])
            out.extend(self.tokens[s : s + ns].tolist())
        return np.asarray(out, dtype=np.int64)
