"""Per-step attention metadata, built once per step for each KV cache group and
read by every layer of the group."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .._core import StepBatch


def per_token(query_start_loc: np.ndarray, seq_lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The sequence of each of a step's ``T`` tokens and the context length
    it attends to (its position + 1), both int32 ``[T]``, from
    ``query_start_loc`` ``[S + 1]`` and ``seq_lens`` ``[S]`` (a sequence's
    new tokens are the last of its context)."""
    q_lens = np.diff(query_start_loc)
    rows = np.repeat(np.arange(len(q_lens), dtype=np.int32), q_lens)
    behind = np.repeat(query_start_loc[1:], q_lens) - 1 - np.arange(int(query_start_loc[-1]))
    lens = (np.repeat(seq_lens, q_lens) - behind).astype(np.int32)
    return rows, lens


@dataclass
class AttentionMetadata:
    """Where a step's tokens go and what each sequence attends to.

    ``T`` tokens, ``S`` sequences, ``B`` block-table width.

    Attributes:
        slot_mapping: int64 ``[T]`` cache slot of each new token (this group's).
        block_tables: int32 ``[S, B]`` (this group's; in a sliding-window group
            the blocks wholly behind the window are released and read 0,
            masked by the window).
        seq_lens: int32 ``[S]`` context length after the step (tokens).
        query_start_loc: int32 ``[S + 1]``.
        decode_seqs: int64 ``[Sd]`` sequences with exactly one new token.
        decode_tokens: int64 ``[Sd]`` their token rows in the step.
        prefills: ``(seq, start, end, seq_len)`` per sequence with more than one
            new token, or a single token of a longer prompt chunk.
        all_decode: every sequence is in decode (the common fast path).
        max_query_len: most new tokens of one sequence in the step.
        token_rows: int32 ``[T]`` the sequence (block-table row) of each token;
            None when ``all_decode`` (row ``i`` is token ``i``).
        token_lens: int32 ``[T]`` context length each token attends to (its
            position + 1); None when ``all_decode`` (``seq_lens``).
    """

    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    decode_seqs: torch.Tensor
    decode_tokens: torch.Tensor
    prefills: list[tuple[int, int, int, int]]
    all_decode: bool
    max_query_len: int
    token_rows: torch.Tensor | None = None
    token_lens: torch.Tensor | None = None

    @classmethod
    def from_batch(
        cls, batch: StepBatch, device: torch.device, group: int = 0
    ) -> AttentionMetadata:
        """Build from the scheduler's step batch, for its KV cache group ``group``."""
        return cls.for_groups(batch, device)[group]

    @classmethod
    def for_groups(cls, batch: StepBatch, device: torch.device) -> list[AttentionMetadata]:
        """One metadata per KV cache group of the step (``batch.kv_groups``, in
        order): each its group's slot mapping and block tables; the fields
        every group shares are computed once and the same tensors."""
        qsl = batch.query_start_loc
        q_lens = np.diff(qsl)
        is_decode = q_lens == 1
        decode_seqs = np.nonzero(is_decode)[0]
        prefill_seqs = np.nonzero(~is_decode)[0]
        seq_lens = batch.seq_lens
        prefills = [(int(s), int(qsl[s]), int(qsl[s + 1]), int(seq_lens[s])) for s in prefill_seqs]
        token_rows = token_lens = None
        if prefills:
            rows, lens = per_token(qsl, seq_lens)
            token_rows, token_lens = (
                torch.from_numpy(rows).to(device),
                torch.from_numpy(lens).to(device),
            )
        seq_lens_t = torch.from_numpy(seq_lens).to(device)
        qsl_t = torch.from_numpy(qsl).to(device)
        decode_seqs_t = torch.from_numpy(decode_seqs).to(device)
        decode_tokens = torch.from_numpy(qsl[:-1][decode_seqs].astype(np.int64)).to(device)
        max_query_len = int(q_lens.max())
        return [
            cls(
                slot_mapping=torch.from_numpy(group.slot_mapping).to(device),
                block_tables=torch.from_numpy(group.block_tables).to(device),
                seq_lens=seq_lens_t,
                query_start_loc=qsl_t,
                decode_seqs=decode_seqs_t,
                decode_tokens=decode_tokens,
                prefills=prefills,
                all_decode=len(prefills) == 0,
                max_query_len=max_query_len,
                token_rows=token_rows,
                token_lens=token_lens,
            )
            for group in batch.kv_groups
        ]
