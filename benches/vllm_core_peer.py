"""vLLM's side of ``bench_core.py``: CPU time per engine step in vLLM's v1 core.

Runs the workloads of ``benches/bench_core.py`` on vLLM's own v1 scheduler
(``vllm.v1.core.sched.scheduler.Scheduler`` and its ``KVCacheManager``; block size
16, prefix caching on, chunked prefill on, max_model_len 4096), driven the way
vLLM's engine core steps it: ``scheduler.schedule()``, then a stand-in for the
model runner (one random token in [3, 50000), never EOS, for every scheduled
request that has reached the end of its prompt/outputs), then
``scheduler.update_from_output(scheduler_output, model_runner_output)``.

Only ``schedule()`` and ``update_from_output()`` are timed (``time.process_time``),
plus, for the prefill workload, building the ``Request`` objects (where vLLM hashes
the prompt's blocks) and ``add_request``, since pagedrs' timing includes its
``add_request`` there. Building the fake ``ModelRunnerOutput`` is not timed. As in
the engine core, the heap alive once a scheduler is built is frozen (``gc.freeze``)
and the cyclic GC stays on while stepping. Stats logging is off (``log_stats=False``).

* decode_N: N running sequences (N = 16, 256, 1024) with 128-token random prompts
  (one untimed prefill step), then ``--steps`` timed steps of one token each;
* prefill_shared: 256 prompts of 1024 tokens sharing a 512-token prefix, token
  budget 8192 per step, from adding the requests until every request has sampled
  its first token (the number of steps goes to stderr).

Needs an interpreter with vLLM (CPU is enough: no model is run) and the local
Hugging Face folder of pagedrs' default model (``$PAGEDRS_CACHE/models`` or
``~/.cache/pagedrs/models``) to build vLLM's ModelConfig offline:

    /path/to/vllm-venv/bin/python benches/vllm_core_peer.py [--steps 200] [--model DIR]

The last stdout line is a JSON object of CPU seconds per step, e.g.
``{"decode_16": ..., "decode_256": ..., "decode_1024": ..., "prefill_shared": ...}``.
Exits non-zero with a message on stderr when vLLM (or the model folder) is unavailable.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core.sched.scheduler import Scheduler

BLOCK_SIZE = 16
DECODE_SIZES = (16, 256, 1024)
PROMPT_LEN = 128
PREFILL_PROMPTS, PREFILL_LEN, PREFILL_SHARED, PREFILL_BUDGET = 256, 1024, 512, 8192
MAX_MODEL_LEN = 4096
EOS_TOKEN_ID = 2  # SmolLM2's; sampled tokens are drawn from [3, 50000)
TOKEN_LOW, TOKEN_HIGH = 3, 50000


def default_model_dir() -> Path:
    """pagedrs' cached copy of its default model (a small Llama)."""
    root = os.environ.get("PAGEDRS_CACHE") or str(Path.home() / ".cache" / "pagedrs")
    return Path(root) / "models" / "smollm2-135m-instruct"


class Peer:
    """Builds vLLM v1 schedulers and requests the way vLLM's engine core does."""

    def __init__(self, model_dir: Path) -> None:
        from vllm.config import CacheConfig
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

        self.model_dir = model_dir
        # As the engine core does, with its default prefix-caching hash (sha256).
        hash_fn = get_hash_fn_by_name(CacheConfig().prefix_caching_hash_algo)
        init_none_hash(hash_fn)
        self.block_hasher = get_request_block_hasher(BLOCK_SIZE, hash_fn)

    def _vllm_config(self, max_num_seqs: int, budget: int, num_blocks: int) -> VllmConfig:
        from vllm.config import (
            CacheConfig,
            DeviceConfig,
            ModelConfig,
            SchedulerConfig,
            VllmConfig,
        )

        model_config = ModelConfig(
            model=str(self.model_dir),
            tokenizer=str(self.model_dir),
            skip_tokenizer_init=True,
            dtype="float16",
            seed=0,
            max_model_len=MAX_MODEL_LEN,
        )
        scheduler_config = SchedulerConfig(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=budget,
            max_model_len=MAX_MODEL_LEN,
            enable_chunked_prefill=True,
            is_encoder_decoder=False,
            async_scheduling=False,  # schedule -> execute -> update, one step at a time
        )
        cache_config = CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=True)
        config = VllmConfig(
            model_config=model_config,
            scheduler_config=scheduler_config,
            cache_config=cache_config,
            device_config=DeviceConfig(device="cpu"),  # no accelerator needed: no model runs
        )
        config.cache_config.num_gpu_blocks = num_blocks
        return config

    def scheduler(self, max_num_seqs: int, budget: int, num_blocks: int) -> Scheduler:
        import torch
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import (
            FullAttentionSpec,
            KVCacheConfig,
            KVCacheGroupSpec,
        )
        from vllm.v1.structured_output import StructuredOutputManager

        config = self._vllm_config(max_num_seqs, budget, num_blocks)
        assert config.cache_config.block_size == BLOCK_SIZE
        assert config.cache_config.enable_prefix_caching
        assert config.scheduler_config.enable_chunked_prefill
        spec = FullAttentionSpec(
            block_size=BLOCK_SIZE, num_kv_heads=1, head_size=64, dtype=torch.float16
        )
        kv_cache_config = KVCacheConfig(
            num_blocks=num_blocks,
            kv_cache_tensors=[],
            kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)],
            hash_block_size=BLOCK_SIZE,
        )
        sched = Scheduler(
            vllm_config=config,
            kv_cache_config=kv_cache_config,
            structured_output_manager=StructuredOutputManager(config),
            block_size=BLOCK_SIZE,
            hash_block_size=BLOCK_SIZE,
            log_stats=False,
        )
        # As the engine core does once it is built: collect, then freeze what is alive
        # (the block pool...) so that the cyclic GC's full passes skip it. The GC stays
        # on while stepping. Drop the previous workload's heap first.
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        return sched

    @staticmethod
    def sampling_params(max_tokens: int) -> SamplingParams:
        from vllm.sampling_params import SamplingParams

        params = SamplingParams(max_tokens=max_tokens)
        # As vLLM's input processor does: the model's EOS becomes the stop token.
        params.update_from_generation_config({}, eos_token_id=EOS_TOKEN_ID)
        return params

    def add_requests(
        self, sched: Scheduler, prompts: list[list[int]], params: SamplingParams
    ) -> None:
        from vllm.v1.request import Request

        for i, prompt in enumerate(prompts):
            req = Request(
                request_id=str(i),
                prompt_token_ids=prompt,
                sampling_params=params,
                pooling_params=None,
                block_hasher=self.block_hasher,
            )
            sched.add_request(req)


def step(sched: Scheduler, tokens: list[int]) -> tuple[float, list[str], dict[str, int]]:
    """One engine step: (CPU seconds in schedule + update_from_output, ids of the
    requests that sampled a token, tokens scheduled per request id).

    ``tokens[k]`` is the token sampled by the k-th request that samples."""
    from vllm.v1.outputs import ModelRunnerOutput

    t0 = time.process_time()
    out = sched.schedule()
    elapsed = time.process_time() - t0

    # Stand-in for the model runner: a request whose scheduled chunk reaches the end
    # of its known tokens samples one; a partial prefill chunk samples nothing.
    req_ids = list(out.num_scheduled_tokens)
    sampled: list[list[int]] = []
    sampled_ids: list[str] = []
    for rid in req_ids:
        if sched.requests[rid].is_prefill_chunk:
            sampled.append([])
        else:
            sampled.append([tokens[len(sampled_ids)]])
            sampled_ids.append(rid)
    runner_out = ModelRunnerOutput(
        req_ids=req_ids,
        req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
        sampled_token_ids=sampled,
    )

    t0 = time.process_time()
    sched.update_from_output(out, runner_out)
    elapsed += time.process_time() - t0
    return elapsed, sampled_ids, out.num_scheduled_tokens


def vllm_decode(peer: Peer, num_seqs: int, steps: int) -> float:
    """Seconds of CPU per decode step with ``num_seqs`` running sequences."""
    rng = np.random.default_rng(0)  # same draws as bench_core.pagedrs_decode
    blocks = num_seqs * ((PROMPT_LEN + steps + 8) // BLOCK_SIZE + 2)
    sched = peer.scheduler(num_seqs, max(8192, num_seqs * PROMPT_LEN), blocks)
    prompts = [rng.integers(TOKEN_LOW, TOKEN_HIGH, PROMPT_LEN).tolist() for _ in range(num_seqs)]
    peer.add_requests(sched, prompts, peer.sampling_params(steps + 10))
    first = rng.integers(TOKEN_LOW, TOKEN_HIGH, num_seqs).tolist()
    _, ids, _ = step(sched, first)  # prefill everything in one step (not timed)
    if len(ids) != num_seqs:
        raise RuntimeError(f"prefill step sampled {len(ids)} of {num_seqs} requests")
    tokens = rng.integers(TOKEN_LOW, TOKEN_HIGH, (steps, num_seqs)).tolist()
    total = 0.0
    for s in range(steps):
        sec, ids, _ = step(sched, tokens[s])
        if len(ids) != num_seqs:
            raise RuntimeError(f"decode step {s} sampled {len(ids)} of {num_seqs} (preempted?)")
        total += sec
    return total / steps


def vllm_prefill(peer: Peer) -> tuple[float, int, int]:
    """(CPU seconds per step, steps, prompt tokens served from the prefix cache) to
    prefill 256 prompts of 1024 tokens sharing a 512-token prefix."""
    rng = np.random.default_rng(1)  # same prompts as bench_core.pagedrs_prefill
    shared = rng.integers(TOKEN_LOW, TOKEN_HIGH, PREFILL_SHARED)
    blocks = PREFILL_PROMPTS * (PREFILL_LEN // BLOCK_SIZE + 2)
    sched = peer.scheduler(PREFILL_PROMPTS, PREFILL_BUDGET, blocks)
    prompts = [
        np.concatenate(
            [shared, rng.integers(TOKEN_LOW, TOKEN_HIGH, PREFILL_LEN - PREFILL_SHARED)]
        ).tolist()
        for _ in range(PREFILL_PROMPTS)
    ]
    params = peer.sampling_params(64)
    tokens = [7] * PREFILL_PROMPTS

    t0 = time.process_time()
    peer.add_requests(sched, prompts, params)  # Request() hashes the prompt's blocks
    total = time.process_time() - t0
    steps = prompt_tokens_computed = 0
    prefilled: set[str] = set()
    while len(prefilled) < PREFILL_PROMPTS:
        sec, ids, scheduled = step(sched, tokens)
        total += sec
        steps += 1
        prompt_tokens_computed += sum(n for rid, n in scheduled.items() if rid not in prefilled)
        prefilled.update(ids)
        if steps > 10 * PREFILL_PROMPTS:
            raise RuntimeError("prefill did not finish")
    cached = PREFILL_PROMPTS * PREFILL_LEN - prompt_tokens_computed
    return total / steps, steps, cached


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--model", type=Path, default=None, help="local HF folder (a Llama)")
    args = ap.parse_args()

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    try:
        import vllm
    except ImportError as e:
        sys.exit(f"vLLM is not importable in {sys.executable}: {e}")
    model_dir = args.model or default_model_dir()
    if not (model_dir / "config.json").is_file():
        sys.exit(f"no Hugging Face model folder at {model_dir} (needed for vLLM's ModelConfig)")

    peer = Peer(model_dir)
    result = {f"decode_{n}": vllm_decode(peer, n, args.steps) for n in DECODE_SIZES}
    result["prefill_shared"], steps, cached = vllm_prefill(peer)
    print(
        f"vLLM {vllm.__version__}: prefill_shared took {steps} steps "
        f"({cached} prompt tokens from the prefix cache)",
        file=sys.stderr,
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
