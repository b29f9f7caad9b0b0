"""The ``draft_model`` proposer: a small model sharing the target's vocabulary
drafts K tokens per speculating sequence, autoregressively, before the
target verifies them in one forward (Leviathan et al. 2023; vLLM's
``method="draft_model"``).

The draft model's KV lives in a KV cache group of its own in the target's
block pool (the last group of ``StepBatch.kv_groups``): the scheduler gives
that group a slot for every position it gives the target, so memory
accounting, preemption, swapping, copy-on-write and the rollback of
rejected drafts cover the draft's KV as the target's. Its layers use the
pool's first tensor pairs (``KVCacheSpec``: one page shape for the pool).

One step, for a batch whose speculating rows the scheduler gave ``d_r``
placeholder draft slots (``Scheduler.set_draft_tokens`` takes the tokens):

1. forward 1: every verified token of the step (prefill chunks, decode
   tokens, each drafted row's pending token), so the draft's KV holds every
   verified position the target's does; the logits at each drafted row's
   pending token give its first draft;
2. forward j + 1 (j = 1 .. max d_r): draft j of each row with ``d_r >= j``
   at its position (the KV of the last draft too, so that when all are
   accepted the draft's KV still covers every verified token); the logits
   of rows with ``d_r > j`` give draft j + 1.

A draft is the argmax of the draft's logits for greedy rows, else a draw
from ``q``: the draft's softmax at the row's temperature after its top-k and
top-p (``Sampler._probs``), kept for the rejection rule
(``rejection.DraftRows``). A seeded row draws with a generator keyed by
(seed, position) (``sampler.salted_generator``), so its drafts, and so its
outputs, repeat run to run.
"""

from __future__ import annotations

import numpy as np
import torch

from .._core import KVCacheGroupBatch, StepBatch
from ..executor.model_runner import ModelRunner
from ..executor.sampler import Sampler, argmax_rows, greedy_rows, salted_generator
from .rejection import DraftRows

#: Salt of a seeded row's draft draws.
_DRAFT_SALT = 0x2545F4914F6CDD1D


def _sub_batch(
    input_ids: np.ndarray,
    positions: np.ndarray,
    query_start_loc: np.ndarray,
    seq_lens: np.ndarray,
    seq_request_ids: np.ndarray,
    group: KVCacheGroupBatch,
    logits_rows: np.ndarray,
) -> StepBatch:
    """A batch of the draft model's forward: its tokens, one KV cache group
    (the draft's), the logits of ``logits_rows``; sampling fields unused."""
    r = len(logits_rows)
    return StepBatch(
        input_ids=np.ascontiguousarray(input_ids, dtype=np.int64),
        positions=np.ascontiguousarray(positions, dtype=np.int64),
        query_start_loc=np.ascontiguousarray(query_start_loc, dtype=np.int32),
        seq_lens=np.ascontiguousarray(seq_lens, dtype=np.int32),
        seq_request_ids=np.ascontiguousarray(seq_request_ids, dtype=np.uint64),
        kv_groups=[group],
        logits_indices=np.ascontiguousarray(logits_rows, dtype=np.int64),
        sample_request_ids=np.zeros(r, np.uint64),
        **greedy_rows(r),
    )


class DraftModelProposer:
    """Runs the draft model of ``speculative_config`` on the target's pool.

    Args:
        runner: the draft model's ``ModelRunner``, built over a one-group
            spec of its layers with no blocks of its own (``share_pool``
            points its layers at the target's pool).
        target: the target's ``ModelRunner`` (owner of the pool).
        group: the draft's KV cache group in the target's spec and the
            step batches (the last).
        seed: seeds the generator of unseeded rows' draft draws.
    """

    def __init__(self, runner: ModelRunner, target: ModelRunner, group: int, seed: int) -> None:
        self.runner = runner
        self.target = target
        self.group = group
        self.num_layers = len(runner.spec.groups[0].layers)
        self.generator = torch.Generator().manual_seed((seed ^ _DRAFT_SALT) % (2**63))

    def share_pool(self) -> None:
        """Point the draft's layers at the target pool's first tensor pairs
        (again after the target's ``resize_kv_cache``)."""
        pairs = self.target.kv_caches[: self.num_layers]
        self.runner.kv_caches = pairs
        self.runner.layer_kv_caches = self.runner.spec.layer_caches(pairs)

    @torch.inference_mode()
    def propose(self, batch: StepBatch) -> tuple[StepBatch, DraftRows | None]:
        """Run the draft model over ``batch`` (the scheduler's, its draft
        slots holding placeholders) and draft each drafted row's tokens.

        Returns:
            the batch with the drafts in ``input_ids`` and
            ``draft_token_ids`` (the same batch when it has no draft slots),
            and the drafts per position row for verification (None without
            drafts). The caller hands ``draft_token_ids`` to
            ``Scheduler.set_draft_tokens``.
        """
        self.share_pool()
        g = batch.kv_groups[self.group]
        nd = batch.num_draft_tokens.astype(np.int64)
        drafted = np.nonzero(nd)[0]
        last = batch.logits_indices.astype(np.int64)
        pending = last[drafted] - nd[drafted]  # token rows of the pending tokens
        t = batch.num_tokens
        is_draft = np.zeros(t, dtype=bool)
        for p, d in zip(pending.tolist(), nd[drafted].tolist(), strict=True):
            is_draft[p + 1 : p + 1 + d] = True
        keep = ~is_draft
        qsl = batch.query_start_loc.astype(np.int64)
        seq_of = np.repeat(np.arange(len(qsl) - 1), np.diff(qsl))
        kept = np.bincount(seq_of[keep], minlength=len(qsl) - 1)
        new_row = np.cumsum(keep) - 1
        rows1 = new_row[pending] if len(drafted) else np.array([int(kept.sum()) - 1])
        logits = self._run(
            _sub_batch(
                batch.input_ids[keep],
                batch.positions[keep],
                np.concatenate([[0], np.cumsum(kept)]),
                batch.seq_lens - (np.diff(qsl) - kept),
                batch.seq_request_ids,
                KVCacheGroupBatch(g.slot_mapping[keep], g.block_tables),
                rows1,
            )
        )
        if not len(drafted):
            return batch, None
        seq_index = {int(s): i for i, s in enumerate(batch.seq_request_ids.tolist())}
        seqs = np.array([seq_index[int(batch.sample_request_ids[r])] for r in drafted])
        sampling = bool((batch.temperature[drafted] > 0).any())
        per_row = nd + 1
        base = np.cumsum(per_row) - per_row  # each row's first position row
        q = None
        if sampling:
            q = torch.zeros(int(per_row.sum()), logits.shape[-1], dtype=torch.float32)
        drafts = np.zeros((len(drafted), int(nd.max())), dtype=np.int64)
        active = np.arange(len(drafted))  # drafted rows whose logits are in ``logits``
        for j in range(int(nd.max()) + 1):
            if j > 0:
                feed = np.nonzero(nd[drafted] >= j)[0]
                want = nd[drafted][feed] > j
                rows = pending[feed] + j
                out = np.nonzero(want)[0]
                logits = self._run(
                    _sub_batch(
                        drafts[feed, j - 1],
                        batch.positions[rows],
                        np.arange(len(feed) + 1),
                        batch.positions[rows] + 1,
                        batch.seq_request_ids[seqs[feed]],
                        KVCacheGroupBatch(g.slot_mapping[rows], g.block_tables[seqs[feed]]),
                        out if len(out) else np.array([0]),
                    )
                )
                active = feed[out]
                if not len(active):
                    break
            drafts[active, j] = self._sample(batch, logits, drafted[active], j, q, base)
        return self._verify_batch(batch, drafted, pending, drafts, nd), self._rows(
            drafted, drafts, nd, base, q
        )

    def _run(self, sub: StepBatch) -> torch.Tensor:
        """The draft's logits of ``sub``'s logits rows, float32 on CPU."""
        logits, _ = self.runner.execute(sub)
        return logits.float().cpu()

    def _sample(
        self,
        b: StepBatch,
        logits: torch.Tensor,
        rows: np.ndarray,
        j: int,
        q: torch.Tensor | None,
        base: np.ndarray,
    ) -> np.ndarray:
        """Draft ``j + 1`` of ``b``'s rows ``rows`` from their draft logits
        ``[len(rows), V]``; a sampling row's ``q`` goes to its position row
        ``base[r] + j``."""
        temp = b.temperature[rows]
        tokens = argmax_rows(logits).numpy().astype(np.int64)
        hot = np.nonzero(temp > 0)[0]
        if len(hot) and q is not None:
            probs = Sampler._probs(
                logits[torch.from_numpy(hot)],
                torch.from_numpy(temp[hot]),
                torch.from_numpy(b.top_p[rows[hot]]),
                torch.from_numpy(b.top_k[rows[hot]]),
            )
            noise = torch.empty_like(probs)
            for i, r in enumerate(rows[hot].tolist()):
                gen = self.generator
                if b.seed[r] >= 0:
                    n_out = int(b.num_output_tokens[r]) + j
                    gen = salted_generator(int(b.seed[r]), 0, n_out, _DRAFT_SALT)
                noise[i].exponential_(generator=gen)
            tokens[hot] = argmax_rows(probs / noise).numpy()
            q[torch.from_numpy(base[rows[hot]] + j)] = probs
        return tokens

    def _verify_batch(
        self,
        batch: StepBatch,
        drafted: np.ndarray,
        pending: np.ndarray,
        drafts: np.ndarray,
        nd: np.ndarray,
    ) -> StepBatch:
        """``batch`` with the drafts in place of the placeholders."""
        input_ids = batch.input_ids.copy()
        flat: list[int] = []
        for i, (p, d) in enumerate(zip(pending.tolist(), nd[drafted].tolist(), strict=True)):
            input_ids[p + 1 : p + 1 + d] = drafts[i, :d]
            flat.extend(drafts[i, :d].tolist())
        return StepBatch(
            input_ids=input_ids,
            positions=batch.positions,
            query_start_loc=batch.query_start_loc,
            seq_lens=batch.seq_lens,
            seq_request_ids=batch.seq_request_ids,
            kv_groups=batch.kv_groups,
            logits_indices=batch.logits_indices,
            sample_request_ids=batch.sample_request_ids,
            temperature=batch.temperature,
            top_p=batch.top_p,
            top_k=batch.top_k,
            seed=batch.seed,
            num_output_tokens=batch.num_output_tokens,
            num_samples=batch.num_samples,
            num_draft_tokens=batch.num_draft_tokens,
            draft_token_ids=np.asarray(flat, dtype=np.int64),
            spec_logits_indices=batch.spec_logits_indices,
        )

    @staticmethod
    def _rows(
        drafted: np.ndarray,
        drafts: np.ndarray,
        nd: np.ndarray,
        base: np.ndarray,
        q: torch.Tensor | None,
    ) -> DraftRows:
        """The drafts per position row (``rejection.DraftRows``)."""
        token_ids = np.full(int((nd + 1).sum()), -1, dtype=np.int64)
        for i, r in enumerate(drafted.tolist()):
            d = int(nd[r])
            token_ids[base[r] : base[r] + d] = drafts[i, :d]
        return DraftRows(token_ids, q)
