"""Beam search inside the engine (PagedAttention paper, §4.4): the beams of a
request are sequences of one group in the Rust scheduler, sharing blocks; each
step, candidates are chosen from every beam's next-token log-probabilities,
beams are forked (copy-on-write on their shared last block) or freed.

The selection follows HF transformers' beam search (top 2k candidates over
beams x vocabulary, finished hypotheses scored sum(logprobs) / length **
length_penalty, its early-stopping rules), so outputs match its
``generate(num_beams=k, do_sample=False)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ...sampling_params import BeamSearchParams
from .messages import RequestDelta, SequenceDelta

_NEG = -1.0e9


@dataclass
class Beam:
    """A running beam: its scheduler sequence, generated tokens and score."""

    seq_id: int
    tokens: list[int]
    score: float  # float32 sum of token logprobs


@dataclass
class BeamStepPlan:
    """What one beam step asks of the scheduler.

    Attributes:
        tokens: sequence id -> token to append (beams that continue).
        forks: (parent sequence, child sequence, child's last token).
        frees: sequences to release (beams no candidate continues).
        done: the search is over; every running sequence is to be released.
    """

    tokens: dict[int, int] = field(default_factory=dict)
    forks: list[tuple[int, int, int]] = field(default_factory=list)
    frees: list[int] = field(default_factory=list)
    done: bool = False


class BeamSearchRequest:
    """The beam search state of one request.

    Args:
        request_id: caller's id.
        prompt_token_ids: prompt tokens.
        params: beam settings.
        eos_token_ids: tokens that finish a beam (unless ignore_eos).
        max_length: prompt + generated tokens at most.
        first_seq_id: the scheduler sequence holding the prompt.
        new_seq_id: allocates scheduler sequence ids for forks.
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: BeamSearchParams,
        eos_token_ids: list[int],
        max_length: int,
        first_seq_id: int,
        new_seq_id: Callable[[], int],
    ) -> None:
        self.request_id = request_id
        self.prompt_token_ids = prompt_token_ids
        self.params = params
        self.eos = set() if params.ignore_eos else set(eos_token_ids)
        self.max_length = max_length
        self.new_seq_id = new_seq_id
        k = params.beam_width
        self.running = [Beam(first_seq_id, [], 0.0)]
        self.finished: list[tuple[list[int], float]] = [([], 0.0)] * k  # (tokens, raw sum)
        self.finished_scores = torch.full((k,), _NEG, dtype=torch.float32)
        self.is_finished = torch.zeros(k, dtype=torch.bool)
        self.heuristic_unsatisfied = True
        self.cur_len = len(prompt_token_ids)
        self.beams_to_keep = max(2, 1 + len(self.eos)) * k
        self.done = False

    def seq_ids(self) -> list[int]:
        """Scheduler sequences of the running beams."""
        return [b.seq_id for b in self.running]

    def step(self, logprobs: torch.Tensor) -> BeamStepPlan:
        """Advance every beam by one token.

        Args:
            logprobs: float32 ``[len(running), V]`` log-softmax of each running
                beam's next-token logits, in ``seq_ids()`` order.
        Returns:
            the forks, frees and appended tokens this step needs.
        """
        k = self.params.beam_width
        vocab = logprobs.shape[1]
        if len(self.running) < k:  # first step: one prompt beam, HF's -1e9 padding
            logprobs = logprobs[:1].expand(k, vocab)
            scores = torch.full((k,), _NEG, dtype=torch.float32)
            scores[0] = self.running[0].score
        else:
            scores = torch.tensor([b.score for b in self.running], dtype=torch.float32)
        acc = (logprobs + scores[:, None]).reshape(-1)
        top_vals, top_idx = torch.topk(acc, self.beams_to_keep)
        # At the first step HF's padding beams copy the prompt beam: map them to it.
        parents = [min(p, len(self.running) - 1) for p in (top_idx // vocab).tolist()]
        tokens = (top_idx % vocab).tolist()
        at_max = self.cur_len + 1 >= self.max_length
        hits = torch.tensor([at_max or t in self.eos for t in tokens])

        # Next running beams: the best k candidates that did not stop.
        run_vals = top_vals + hits.to(torch.float32) * _NEG
        chosen = torch.topk(run_vals, k).indices.tolist()

        # Finished hypotheses: stopped candidates among the top k.
        just_finished = hits & (torch.arange(self.beams_to_keep) < k)
        norm = top_vals / (
            (self.cur_len + 1 - len(self.prompt_token_ids)) ** self.params.length_penalty
        )
        full = bool(self.is_finished.all()) and self.params.early_stopping is True
        norm = norm + float(full) * _NEG
        norm = norm + float(not self.heuristic_unsatisfied) * _NEG
        norm = norm + (~just_finished).to(torch.float32) * _NEG
        cand_seqs = [
            (self.running[p].tokens + [t], float(v))
            for p, t, v in zip(parents, tokens, top_vals.tolist(), strict=True)
        ]
        merged_scores = torch.cat((self.finished_scores, norm))
        merged_flags = torch.cat((self.is_finished, just_finished))
        merged = self.finished + cand_seqs
        keep = torch.topk(merged_scores, k).indices
        self.finished = [merged[i] for i in keep.tolist()]
        self.finished_scores = merged_scores[keep]
        self.is_finished = merged_flags[keep]

        old_ids = self.seq_ids()
        plan = self._reassign(parents, tokens, run_vals, chosen)
        self.cur_len += 1
        self._check_heuristic()
        all_hit = bool(hits.all())
        if (
            not self.heuristic_unsatisfied
            or (bool(self.is_finished.all()) and self.params.early_stopping is True)
            or all_hit
        ):
            self.done = plan.done = True
            plan.frees = old_ids
            plan.forks.clear()
        return plan

    def _reassign(
        self, parents: list[int], tokens: list[int], run_vals: torch.Tensor, chosen: list[int]
    ) -> BeamStepPlan:
        """Map the chosen candidates onto scheduler sequences: a parent's first
        candidate continues it, later ones fork it, unchosen parents are freed."""
        plan = BeamStepPlan()
        new_running: list[Beam] = []
        used: set[int] = set()
        for c in chosen:
            p = parents[c]
            parent = self.running[p]
            tokens_c = parent.tokens + [tokens[c]]
            score = float(run_vals[c])
            if p not in used:
                used.add(p)
                plan.tokens[parent.seq_id] = tokens[c]
                new_running.append(Beam(parent.seq_id, tokens_c, score))
            else:
                child = self.new_seq_id()
                plan.forks.append((parent.seq_id, child, tokens[c]))
                new_running.append(Beam(child, tokens_c, score))
        plan.frees = [b.seq_id for i, b in enumerate(self.running) if i not in used]
        self.running = new_running
        return plan

    def _check_heuristic(self) -> None:
        """HF's early-stop heuristic: can a running beam still beat the worst
        finished hypothesis?"""
        gen_len = self.cur_len - len(self.prompt_token_ids)
        if self.params.early_stopping == "never" and self.params.length_penalty > 0.0:
            gen_len = self.max_length - len(self.prompt_token_ids)
        best_running = torch.tensor(self.running[0].score, dtype=torch.float32) / (
            gen_len**self.params.length_penalty
        )
        worst = torch.where(self.is_finished, self.finished_scores.min(), torch.tensor(_NEG))
        self.heuristic_unsatisfied = self.heuristic_unsatisfied and bool(
            (best_running > worst).any()
        )

    def output(self) -> RequestDelta:
        """The finished hypotheses, best first, as the request's final delta
        (each hypothesis a sequence: its whole token ids and raw logprob sum;
        the front end decodes their text)."""
        outs: list[SequenceDelta] = []
        for (toks, raw), done in zip(self.finished, self.is_finished.tolist(), strict=True):
            if not done:
                continue
            reason = "stop" if toks and toks[-1] in self.eos else "length"
            stop = toks[-1] if reason == "stop" else None
            outs.append(SequenceDelta(len(outs), list(toks), None, raw, reason, stop))
        return RequestDelta(self.request_id, outs, True)
