"""CUDA-graph decode steps (``executor.cuda_graphs``) on CPU: a stand-in
capturer replays by calling the captured forward again on the static
buffers, so bucket choice, padding (token 0, slot -1, context 1 over block 0),
block-table copies and output slicing run as on a GPU; outputs must equal the
eager engine's (and so HF's) token for token."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from pagedrs import LLM, EngineArgs, SamplingParams
from pagedrs.engine.core.setup import uses_cuda_graphs
from pagedrs.executor.cuda_graphs import DecodeGraphs, EagerReplay, capture_sizes
from reference import PROMPTS


def test_capture_sizes() -> None:
    assert capture_sizes(1) == [1]
    assert capture_sizes(6) == [1, 2, 4, 6]
    assert capture_sizes(20) == [1, 2, 4, 8, 16, 20]
    assert capture_sizes(256)[:5] == [1, 2, 4, 8, 16] and capture_sizes(256)[-1] == 256
    assert len(capture_sizes(256)) == 35


def test_buckets_and_padding_of_the_static_buffers() -> None:
    seen: list[tuple[torch.Tensor, ...]] = []

    def forward(ids, pos, meta):
        seen.append(
            (
                ids.clone(),
                pos.clone(),
                meta[0].slot_mapping.clone(),
                meta[0].seq_lens.clone(),
                meta[0].block_tables.clone(),
            )
        )
        return torch.stack([ids.float(), pos.float()], dim=1) * 2

    graphs = DecodeGraphs(forward, [5], [1, 2, 4, 8], torch.device("cpu"))
    graphs.capture(EagerReplay(), warmup=0)
    assert [graphs.bucket(n) for n in (1, 2, 3, 5, 8, 9)] == [1, 2, 4, 8, 8, None]

    import numpy as np
    from pagedrs._core import KVCacheGroupBatch, StepBatch

    s = 3
    tables = np.array([[4, 1, 0], [7, 0, 0], [2, 3, 6]], np.int32)
    batch = StepBatch(
        input_ids=np.array([11, 12, 13], np.int64),
        positions=np.array([20, 5, 40], np.int64),
        query_start_loc=np.arange(s + 1, dtype=np.int32),
        seq_lens=np.array([21, 6, 41], np.int32),
        seq_request_ids=np.arange(s, dtype=np.uint64),
        kv_groups=[KVCacheGroupBatch(np.array([65, 117, 102], np.int64), tables)],
        logits_indices=np.arange(s, dtype=np.int64),
        sample_request_ids=np.arange(s, dtype=np.uint64),
        temperature=np.zeros(s, np.float32),
        top_p=np.ones(s, np.float32),
        top_k=np.full(s, -1, np.int32),
        seed=np.full(s, -1, np.int64),
        num_output_tokens=np.ones(s, np.int64),
        num_samples=np.ones(s, np.int32),
    )
    assert graphs.can_run(batch)
    out = graphs.run(batch)
    assert graphs.replays[4] == 1
    ids, pos, slots, lens, tab = seen[-1]
    assert ids.tolist() == [11, 12, 13, 0] and pos.tolist() == [20, 5, 40, 0]
    assert slots.tolist() == [65, 117, 102, -1] and lens.tolist() == [21, 6, 41, 1]
    assert tab[:3, :3].tolist() == tables.tolist() and tab[3].tolist() == [0] * 5
    assert out.tolist() == [[22.0, 40.0], [24.0, 10.0], [26.0, 80.0]]
    # Wider block tables than captured, or a prefill step: eager.
    wide = StepBatch(
        **{
            k: getattr(batch, k)
            for k in (
                "input_ids",
                "positions",
                "query_start_loc",
                "seq_lens",
                "seq_request_ids",
                "logits_indices",
                "sample_request_ids",
                "temperature",
                "top_p",
                "top_k",
                "seed",
                "num_output_tokens",
                "num_samples",
            )
        },
        kv_groups=[KVCacheGroupBatch(np.array([1, 2, 3], np.int64), np.zeros((3, 6), np.int32))],
    )
    assert not graphs.can_run(wide)


def _greedy(llm: LLM, prompts: list[str], n: int = 12) -> list[list[int]]:
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=n))
    return [list(o.outputs[0].token_ids) for o in outs]


@pytest.mark.parametrize("model_impl", ["pagedrs", "transformers"])
def test_graph_replay_equals_eager(tiny_model_dir: Path, model_impl: str) -> None:
    llm = LLM(str(tiny_model_dir), model_impl=model_impl, max_model_len=128, max_num_seqs=8)
    runner = llm.llm_engine.engine_core.runner
    assert runner.graphs is None  # CPU: eager, whatever enforce_eager says
    batches = [PROMPTS[:1], PROMPTS[:3], PROMPTS[:5], PROMPTS]
    want = [_greedy(llm, b) for b in batches]
    replay = EagerReplay()
    assert runner.capture_cuda_graphs(8, 128, capturer=replay)
    assert replay.captured == len(capture_sizes(8))
    got = [_greedy(llm, b) for b in batches]
    assert got == want
    replays = runner.graphs.replays
    assert replays[1] > 0 and replays[4] > 0 and replays[8] > 0  # 3 and 5 sequences padded
    stats = llm.kv_cache_stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"]


def test_graphs_only_on_cuda_and_not_under_enforce_eager() -> None:
    assert not uses_cuda_graphs(EngineArgs(device="cpu"))
    assert not uses_cuda_graphs(EngineArgs(device="cpu", enforce_eager=False))
    assert EngineArgs(enforce_eager=True).enforce_eager
