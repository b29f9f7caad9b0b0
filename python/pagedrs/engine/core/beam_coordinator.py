"""Beam search inside the step loop: picks the beam groups' tokens from the
step's logits, holds a group that is not wholly in the step, and applies each
group's forks and frees to the scheduler afterwards (PagedAttention §4.4).
The per-request selection rule lives in ``beam_search``."""

from __future__ import annotations

import numpy as np
import pagedrs._core as _core
import torch

from ...sampling_params import BeamSearchParams
from .beam_search import BeamSearchRequest, BeamStepPlan
from .messages import RequestDelta
from .registry import RequestRegistry

BeamPlans = list[tuple[BeamSearchRequest, BeamStepPlan]]


class BeamSearchCoordinator:
    """Drives every live beam-search request of one engine.

    Args:
        scheduler: the engine's Rust scheduler.
        registry: the engine's request registry (its ``beam_of`` map).
    """

    def __init__(self, scheduler: _core.Scheduler, registry: RequestRegistry) -> None:
        self.scheduler = scheduler
        self.registry = registry

    def check_fits(
        self, prompt_len: int, params: BeamSearchParams, max_num_seqs: int, max_model_len: int
    ) -> None:
        """All beams of a request run together, so they must fit together.

        Raises:
            ValueError: beam_width over max_num_seqs, or beams of full length
                needing more blocks than the whole KV cache.
        """
        if params.beam_width > max_num_seqs:
            raise ValueError(f"beam_width={params.beam_width} exceeds max_num_seqs={max_num_seqs}")
        stats = self.scheduler.stats()
        length = min(prompt_len + params.max_tokens, max_model_len)
        need = params.beam_width * self.scheduler.max_blocks_per_seq(length)
        if need > stats.num_total_blocks:
            raise ValueError(
                f"beam search needs up to {need} KV blocks ({params.beam_width} beams x "
                f"{length} tokens), but the KV cache has {stats.num_total_blocks}"
            )

    def choose_tokens(
        self, batch: _core.StepBatch, logits: torch.Tensor, tokens: np.ndarray
    ) -> BeamPlans:
        """Write the beam rows' tokens into ``tokens`` (int64 ``[K]``, one per
        sampled row: beam rows never sample more than one). A group not wholly
        in this step gets ``HOLD_TOKEN`` on its rows: the scheduler appends
        nothing and runs their last token again next step.

        Returns:
            the plans of the groups that advanced, for ``apply``.
        """
        beam_of = self.registry.beam_of
        rows = {rid: r for r, rid in enumerate(batch.sample_request_ids.tolist()) if rid in beam_of}
        plans: BeamPlans = []
        for beam in {id(b): b for b in (beam_of[i] for i in rows)}.values():
            ids = beam.seq_ids()
            if not all(i in rows for i in ids):
                for i in ids:
                    if i in rows:
                        tokens[rows[i]] = _core.HOLD_TOKEN
                continue
            idx = [rows[i] for i in ids]
            plan = beam.step(logits[idx].float().log_softmax(dim=-1))
            for i in ids:
                tokens[rows[i]] = plan.tokens.get(i, 0)
            plans.append((beam, plan))
        return plans

    def apply(self, plans: BeamPlans, ended: set[int]) -> list[RequestDelta]:
        """Fork and free the planned sequences (after ``Scheduler.update``);
        ``ended`` are the sequences the scheduler has just finished.

        Returns:
            the final deltas of the searches that are over.
        """
        outputs = []
        for beam, plan in plans:
            for parent, child, token in plan.forks:
                self.scheduler.fork(parent, child, token)
                self.registry.beam_of[child] = beam
            for seq in plan.frees:
                if seq not in ended:
                    self.scheduler.stop_request(seq)
                self.registry.beam_of.pop(seq, None)
            if plan.done:
                self.registry.pop_beam(beam.request_id)
                outputs.append(beam.output())
        return outputs

    def abort(self, request_id: str) -> RequestDelta | None:
        """Abort a beam search (every beam's blocks return at once); its final
        delta (the hypotheses finished so far), or None if ``request_id`` is not
        a live beam search."""
        beam = self.registry.pop_beam(request_id)
        if beam is None:
            return None
        for seq in beam.seq_ids():
            self.scheduler.abort(seq)
        return beam.output()
