"""Type stub of ``pagedrs._core``, the Rust core (PyO3).

The step contract: ``Scheduler.schedule()`` returns a ``SchedulerOutput`` (a
``StepBatch`` of flat numpy arrays and the ``BlockMoves`` to apply first);
``Scheduler.update()`` takes the sampled tokens (with speculative decoding,
each row's accepted draft tokens first, and their counts) and returns the
``FinishedRequest`` s. Shapes: ``T`` scheduled tokens, ``S`` scheduled
sequences, ``R`` sampled rows, ``D`` draft tokens, ``B`` widest block table,
``M`` block pairs.
CI checks this stub against the built module (``mypy.stubtest``).
"""

from collections.abc import Sequence
from typing import Any, final

import numpy as np
import numpy.typing as npt

__version__: str
HOLD_TOKEN: int
ALLOCATION_POLICIES: list[str]
PREEMPTION_MODES: list[str]
SCHEDULING_POLICIES: list[str]

def child_seed(seed: int, index: int) -> int:
    """Seed of the ``index``-th sequence of a parallel-sampling group whose
    first sequence has ``seed`` (-1, no seed, stays -1)."""

def check_scheduler_args(
    block_size: int,
    max_num_seqs: int,
    max_num_batched_tokens: int | None = None,
    preemption_mode: str = "recompute",
    allocation_policy: str = "paged",
) -> None:
    """Validate the scheduler settings known before the model is loaded (the
    rest are checked when the ``Scheduler`` is built).

    Raises:
        ValueError: naming the argument.
    """

def check_speculative_config(speculative_config: dict[str, Any]) -> dict[str, Any]:
    """Validate a ``speculative_config`` dict as ``Scheduler`` does (vLLM's
    field names: ``method`` "ngram", "suffix" or "draft_model" (whose
    ``model`` the Python engine loads: pass the dict without it),
    ``num_speculative_tokens`` (required for draft_model),
    ``prompt_lookup_min``, ``prompt_lookup_max``,
    ``suffix_decoding_max_tree_depth``, ``suffix_decoding_max_spec_factor``,
    ``suffix_decoding_min_token_prob``, ``suffix_decoding_max_cached_requests``;
    pagedrs' ``draft_length_policy`` "goodput" or "fixed" and
    ``draft_step_costs``, ``[batch, decode_s, draft_s]`` points; absent or
    None fields take vLLM's defaults, "goodput" without points). Returns
    every field in force.

    Raises:
        ValueError: naming the field (unknown, a bad value, a draft ``model``).
    """

def spm_merges_json(tokens: Sequence[str]) -> str:
    """The BPE merges of a SentencePiece vocabulary that lists none (a GGUF
    ``llama`` tokenizer such as Gemma's), as transformers derives them for
    such a file: for each distinct token in the order of its last id, every
    split of it into two vocabulary tokens, the longer left part (in
    characters) first. ``tokens``: the vocabulary by id. Returns JSON text,
    ``[["left", "right"], ...]``, best merge first."""

def block_hashes(
    token_ids: Sequence[int], block_size: int, cache_salt: str | None = None, lora_id: int = 0
) -> list[bytes]:
    """The 32-byte SHA-256 hashes the engine names a request's full blocks by:
    chained over the token ids (little-endian u32) and, in the first block,
    the UTF-8 cache salt and the LoRA adapter (``lora_id`` > 0: the byte 0xFF
    and the id as 8 little-endian bytes); ``len(token_ids) // block_size``
    of them.

    Raises:
        ValueError: block_size is 0.
        OverflowError: a token id outside [0, 2**32).
    """

@final
class KVCacheEvent:
    """One change to the device pool's prefix cache (``Scheduler.take_kv_events``).

    ``kind`` "stored": full blocks became cached (``block_hashes`` in chain
    order after ``parent_block_hash``, None for a sequence's first block;
    ``token_ids`` their tokens, ``block_size`` per block). "removed": cached
    blocks were evicted (``block_hashes``). "all_cleared": every cached block
    was dropped (no hashes).
    """

    @property
    def kind(self) -> str:
        """ "stored", "removed" or "all_cleared"."""
    @property
    def group(self) -> int:
        """KV cache group whose blocks changed (0 with one attention type)."""
    @property
    def block_hashes(self) -> list[bytes]:
        """32-byte SHA-256 block hashes, in chain order."""
    @property
    def parent_block_hash(self) -> bytes | None:
        """Hash of the block before the first stored one, or None."""
    @property
    def token_ids(self) -> list[int]:
        """Tokens of the stored blocks (``len(block_hashes) * block_size``)."""
    @property
    def block_size(self) -> int:
        """Tokens per block."""
    @property
    def lora_id(self) -> int | None:
        """The stored blocks' LoRA adapter (``lora_int_id``); None for the
        base model and other kinds."""

@final
class KVCacheGroupBatch:
    """Block tables and slot mapping of one KV cache group (layers of one
    attention type and page size), in ``Scheduler(kv_cache_groups=...)`` order."""

    @property
    def slot_mapping(self) -> npt.NDArray[np.int64]:
        """int64 ``[T]``: cache slot (``block * block_size + offset``) of each token."""
    @property
    def block_tables(self) -> npt.NDArray[np.int32]:
        """int32 ``[S, B]``: physical block ids per sequence, padded with 0;
        in a sliding-window group, blocks released behind the window are 0."""
    def __new__(
        cls, slot_mapping: npt.NDArray[np.int64], block_tables: npt.NDArray[np.int32]
    ) -> KVCacheGroupBatch: ...
    def __reduce__(self) -> Any: ...

@final
class StepBatch:
    """The flat model inputs of one step."""

    @property
    def input_ids(self) -> npt.NDArray[np.int64]:
        """int64 ``[T]``: token ids to run."""
    @property
    def positions(self) -> npt.NDArray[np.int64]:
        """int64 ``[T]``: absolute position of each token."""
    @property
    def query_start_loc(self) -> npt.NDArray[np.int32]:
        """int32 ``[S + 1]``: offset of each sequence's first token."""
    @property
    def seq_lens(self) -> npt.NDArray[np.int32]:
        """int32 ``[S]``: context length (cached + new tokens) after the step."""
    @property
    def seq_request_ids(self) -> npt.NDArray[np.uint64]:
        """uint64 ``[S]``: request id of each scheduled sequence."""
    @property
    def seq_lora_ids(self) -> npt.NDArray[np.uint64]:
        """uint64 ``[S]``: LoRA adapter id of each scheduled sequence (0: the
        base model)."""
    @property
    def kv_groups(self) -> tuple[KVCacheGroupBatch, ...]:
        """One ``KVCacheGroupBatch`` per KV cache group."""
    @property
    def logits_indices(self) -> npt.NDArray[np.int64]:
        """int64 ``[R]``: token row whose logits are sampled (the row's last
        scheduled token: its last draft when it has drafts)."""
    @property
    def sample_request_ids(self) -> npt.NDArray[np.uint64]:
        """uint64 ``[R]``: request id of each sampled row."""
    @property
    def temperature(self) -> npt.NDArray[np.float32]:
        """float32 ``[R]`` (0 = greedy)."""
    @property
    def top_p(self) -> npt.NDArray[np.float32]:
        """float32 ``[R]``."""
    @property
    def top_k(self) -> npt.NDArray[np.int32]:
        """int32 ``[R]`` (-1 = off)."""
    @property
    def seed(self) -> npt.NDArray[np.int64]:
        """int64 ``[R]`` per-request seed (-1 = none)."""
    @property
    def num_output_tokens(self) -> npt.NDArray[np.int64]:
        """int64 ``[R]``: tokens generated so far by each sampled request."""
    @property
    def num_samples(self) -> npt.NDArray[np.int32]:
        """int32 ``[R]``: tokens to sample from each row (> 1 at a group's first sample)."""
    @property
    def num_draft_tokens(self) -> npt.NDArray[np.int32]:
        """int32 ``[R]``: draft tokens of each row (0 without speculative
        decoding): the last ``num_draft_tokens[r]`` tokens of its sequence."""
    @property
    def draft_token_ids(self) -> npt.NDArray[np.int64]:
        """int64 ``[D]``: the draft tokens, row by row."""
    @property
    def spec_logits_indices(self) -> npt.NDArray[np.int64]:
        """int64 ``[R + D]``: per row, the token rows of its pending token and
        of each draft (``num_draft_tokens[r] + 1`` consecutive rows ending at
        ``logits_indices[r]``): the j-th one's logits verify draft j + 1, the
        last give the token after the drafts. Equal to ``logits_indices``
        without drafts."""
    @property
    def num_tokens(self) -> int:
        """``T`` (0 on a step that only moves blocks)."""
    @property
    def num_seqs(self) -> int:
        """``S``."""
    @property
    def num_sampled_tokens(self) -> int:
        """``sum(num_samples)``: tokens ``Scheduler.update()`` expects (plus
        each row's accepted drafts under speculative decoding)."""
    @property
    def num_drafts(self) -> int:
        """``D = sum(num_draft_tokens)``."""
    def __new__(
        cls,
        input_ids: npt.NDArray[np.int64],
        positions: npt.NDArray[np.int64],
        query_start_loc: npt.NDArray[np.int32],
        seq_lens: npt.NDArray[np.int32],
        seq_request_ids: npt.NDArray[np.uint64],
        kv_groups: list[KVCacheGroupBatch] | tuple[KVCacheGroupBatch, ...],
        logits_indices: npt.NDArray[np.int64],
        sample_request_ids: npt.NDArray[np.uint64],
        temperature: npt.NDArray[np.float32],
        top_p: npt.NDArray[np.float32],
        top_k: npt.NDArray[np.int32],
        seed: npt.NDArray[np.int64],
        num_output_tokens: npt.NDArray[np.int64],
        num_samples: npt.NDArray[np.int32],
        num_draft_tokens: npt.NDArray[np.int32] | None = None,
        draft_token_ids: npt.NDArray[np.int64] | None = None,
        spec_logits_indices: npt.NDArray[np.int64] | None = None,
        seq_lora_ids: npt.NDArray[np.uint64] | None = None,
    ) -> StepBatch: ...
    def __reduce__(self) -> Any: ...

@final
class BlockMoves:
    """Block moves applied before the forward pass: swap out, swap in, copies."""

    @property
    def swap_out(self) -> npt.NDArray[np.int64]:
        """int64 ``[M, 2]``: (device block, CPU block) pairs."""
    @property
    def swap_in(self) -> npt.NDArray[np.int64]:
        """int64 ``[M, 2]``: (CPU block, device block) pairs."""
    @property
    def copies(self) -> npt.NDArray[np.int64]:
        """int64 ``[M, 2]``: (source, destination) device blocks (copy-on-write)."""
    @property
    def is_empty(self) -> bool:
        """True when there is nothing to move."""
    def __new__(
        cls,
        swap_out: npt.NDArray[np.int64],
        swap_in: npt.NDArray[np.int64],
        copies: npt.NDArray[np.int64],
    ) -> BlockMoves: ...
    def __reduce__(self) -> Any: ...

@final
class SchedulerOutput:
    """One ``Scheduler.schedule()``: the batch and the block moves before it."""

    @property
    def batch(self) -> StepBatch: ...
    @property
    def block_moves(self) -> BlockMoves: ...
    def __new__(cls, batch: StepBatch, block_moves: BlockMoves) -> SchedulerOutput: ...
    def __reduce__(self) -> Any: ...

@final
class FinishedRequest:
    """A sequence that left the scheduler."""

    @property
    def id(self) -> int:
        """Sequence (internal request) id."""
    @property
    def reason(self) -> str:
        """ "stop", "length" or "abort"."""
    @property
    def stop_token(self) -> int | None:
        """The stop token that ended it, or None."""
    @property
    def output_token_ids(self) -> npt.NDArray[np.uint32]:
        """uint32 ``[N]``: every generated token id."""

@final
class KVCacheStats:
    """Block pool and scheduler counters (blocks, tokens, steps)."""

    @property
    def num_total_blocks(self) -> int: ...
    @property
    def num_free_blocks(self) -> int: ...
    @property
    def num_used_blocks(self) -> int: ...
    @property
    def num_cached_blocks(self) -> int: ...
    @property
    def num_evicted_blocks(self) -> int: ...
    @property
    def num_cpu_blocks(self) -> int: ...
    @property
    def num_free_cpu_blocks(self) -> int: ...
    @property
    def num_preemptions(self) -> int: ...
    @property
    def num_swapped_out(self) -> int: ...
    @property
    def num_swapped_in(self) -> int: ...
    @property
    def prefix_cache_queries(self) -> int: ...
    @property
    def prefix_cache_hits(self) -> int: ...
    @property
    def num_waiting(self) -> int: ...
    @property
    def num_running(self) -> int: ...
    @property
    def num_swapped(self) -> int: ...
    @property
    def num_steps(self) -> int: ...
    @property
    def block_size(self) -> int: ...
    @property
    def num_token_states(self) -> int: ...
    @property
    def num_table_blocks(self) -> int: ...
    @property
    def num_allocated_slots(self) -> int: ...
    @property
    def kv_cache_utilization(self) -> float: ...
    @property
    def allocation_policy(self) -> str: ...
    @property
    def spec_decode_num_drafts(self) -> int:
        """Sequence steps that carried draft tokens."""
    @property
    def spec_decode_num_draft_tokens(self) -> int:
        """Draft tokens scheduled."""
    @property
    def spec_decode_num_accepted_tokens(self) -> int:
        """Draft tokens accepted."""
    @property
    def spec_decode_num_accepted_tokens_per_pos(self) -> list[int]:
        """``[i]``: drafts accepted at draft position ``i`` (0-based)."""
    @property
    def groups(self) -> tuple[KVCacheGroupStats, ...]:
        """One ``KVCacheGroupStats`` per KV cache group."""
    def as_dict(self) -> dict[str, Any]:
        """Every field by name (``groups`` as a list of dicts)."""

@final
class KVCacheGroupStats:
    """What one KV cache group's blocks hold (a shared block counts once)."""

    @property
    def sliding_window(self) -> int | None:
        """Window in tokens, or None for full attention."""
    @property
    def num_used_blocks(self) -> int: ...
    @property
    def num_token_states(self) -> int: ...
    @property
    def num_allocated_slots(self) -> int: ...
    @property
    def kv_cache_utilization(self) -> float: ...
    def as_dict(self) -> dict[str, Any]:
        """Every field by name."""

@final
class MemoryBreakdown:
    """Where the device pool's token slots are right after ``schedule()``."""

    @property
    def total_slots(self) -> int: ...
    @property
    def token_states(self) -> int: ...
    @property
    def reservation(self) -> int: ...
    @property
    def internal(self) -> int: ...
    @property
    def external(self) -> int: ...
    @property
    def free(self) -> int: ...
    @property
    def num_running(self) -> int: ...
    @property
    def num_waiting(self) -> int: ...
    @property
    def admission_block(self) -> str: ...
    def as_dict(self) -> dict[str, Any]:
        """Every field by name."""

@final
class Scheduler:
    """Continuous-batching scheduler over a paged KV cache.

    Raises:
        ValueError: an invalid setting, naming the argument.
    """

    def __new__(
        cls,
        num_blocks: int,
        block_size: int,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        enable_chunked_prefill: bool = True,
        enable_prefix_caching: bool = True,
        num_cpu_blocks: int = 0,
        preemption_mode: str = "recompute",
        allocation_policy: str = "paged",
        kv_cache_groups: Sequence[int | None] | None = None,
        scheduling_policy: str = "fcfs",
        enable_kv_cache_events: bool = False,
        speculative_config: dict[str, Any] | None = None,
    ) -> Scheduler: ...
    def add_request(
        self,
        request_id: int,
        prompt_token_ids: npt.NDArray[np.int64],
        max_tokens: int,
        stop_token_ids: list[int],
        min_tokens: int = 0,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = -1,
        seed: int = -1,
        cache_salt: str | None = None,
        child_ids: list[int] = ...,
        expected_output_len: int | None = None,
        priority: int = 0,
        num_speculative_tokens: int | None = None,
        lora_id: int = 0,
    ) -> None: ...
    def schedule(self) -> SchedulerOutput | None: ...
    def update(
        self,
        sampled: npt.NDArray[np.int64],
        num_accepted: npt.NDArray[np.int64] | None = None,
    ) -> list[FinishedRequest]:
        """Apply the step: per sampled row, its ``num_accepted[r]`` accepted
        drafts (equal to its first drafts), then ``num_samples[r]`` tokens (the
        target's token after them). Stops and ``max_tokens`` inside the run end
        it there; rejected drafts' slots return to the pool.

        Raises:
            ValueError: lengths not matching the step, more accepted than
                drafted, an accepted token that is not the draft (nothing
                is applied).
        """
    def set_draft_tokens(self, draft_token_ids: npt.NDArray[np.int64]) -> None:
        """Write a draft model's tokens into the step in flight (method
        "draft_model": ``schedule()`` reserves the draft slots with
        placeholder tokens), row by row as ``StepBatch.draft_token_ids``,
        before ``update()``.

        Raises:
            ValueError: no step in flight, a length other than the step's
                draft slots, an id outside [0, 2^32) (nothing changes).
        """
    def speculative_config(self) -> dict[str, Any] | None:
        """The speculative decoding settings in force, or None when off."""
    def abort(self, request_id: int) -> FinishedRequest | None: ...
    def cancel_step(self) -> None: ...
    def stop_request(self, request_id: int) -> FinishedRequest | None: ...
    def replace_pending(
        self, request_id: int, token_ids: npt.NDArray[np.int64]
    ) -> tuple[int, FinishedRequest | None]:
        """Replace the request's pending (sampled, not computed) output token by
        ``token_ids`` between steps (jump-forward decoding); returns the tokens
        appended and the ``FinishedRequest`` when one of them ended it."""
    def fork(self, parent: int, child: int, last_token: int | None = None) -> None: ...
    def max_blocks_per_seq(self, num_tokens: int) -> int:
        """Most blocks one sequence of ``num_tokens`` tokens holds at once over
        every KV cache group."""
    def set_max_loras(self, max_loras: int | None) -> None:
        """Bound the distinct LoRA adapters among the running sequences
        (None: no bound).

        Raises:
            ValueError: max_loras is 0.
        """
    def running_loras(self) -> list[int]:
        """The distinct LoRA adapter ids (non-zero) of the running sequences."""
    def has_unfinished_requests(self) -> bool: ...
    def stats(self) -> KVCacheStats: ...
    def memory_breakdown(self) -> MemoryBreakdown: ...
    def take_kv_events(self) -> list[KVCacheEvent]:
        """The prefix-cache changes since the last call, oldest first; empty
        unless built with ``enable_kv_cache_events``."""
    def set_draft_step_costs(self, costs: Sequence[Sequence[float]] | None) -> None:
        """Replace the step cost model of the goodput draft-length policy,
        from the next ``schedule()`` on (``speculative_config.draft_step_costs``):
        ``[batch, decode_s, draft_s]`` points, or None to draft every
        proposal in full. Ignored without speculative decoding.

        Raises:
            ValueError: bad points, or points under draft_length_policy
                "fixed", naming ``draft_step_costs``.
        """
    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix (an "all_cleared" event) when no device
        block is in use; returns whether it did.

        Raises:
            ValueError: a step is in flight.
        """

class QuantWeights:
    """The weight parts of one projection ``y = x W^T``, stacked along the
    output features, each in its own format, read in place (no copy).
    ``parts``: ``(qtype, data, scales, n, layout)`` per part: ``qtype`` one of
    "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "int8";
    ``layout`` "rows" or "panels"; ``data`` C-contiguous uint8: "rows" ``[n,
    row_bytes]`` (GGUF blocks; int8: the values' bytes ``[n, k]``), "panels"
    ``quant_repack``'s ``[ceil(n / 16) * 16, row_bytes]`` (Q4_0, Q4_1,
    Q5_0, Q5_1, Q8_0); ``scales`` float32 ``[n]`` for int8, else None.
    ``in_features`` a multiple of 32 (256 for k-quants). Raises ValueError
    naming the part on an unknown format, a ``k`` the format cannot hold, or
    arrays of the wrong dtype or shape."""

    @property
    def in_features(self) -> int: ...
    @property
    def out_features(self) -> int: ...
    @property
    def nbytes(self) -> int:
        """Bytes of the parts' data and scales."""
    def __new__(
        cls,
        parts: list[tuple[str, npt.NDArray[np.uint8], npt.NDArray[np.float32] | None, int, str]],
        in_features: int,
    ) -> QuantWeights: ...
    def forward(
        self,
        x: npt.NDArray[np.float32] | npt.NDArray[np.int16],
        out: npt.NDArray[np.float32],
        num_threads: int = 1,
        isa: str | None = None,
        activations: str = "int16",
    ) -> None:
        """``out = x W^T`` (``x`` ``[T, K]`` float32 or int16 holding bfloat16
        bits, ``out`` float32 ``[T, N]``), activations quantized per row in
        blocks of 32 to ``activations`` ("int16" or "int8"); ``isa`` one of
        ``quant_isas()`` (None: the fastest; all give the same bits). Raises
        ValueError on wrong dtypes or shapes, a variant this CPU does not
        run, or another ``activations``."""

_PartSpec = tuple[str, npt.NDArray[np.uint8], npt.NDArray[np.float32] | None, int]

class QuantExperts:
    """A mixture-of-experts layer's routed experts over its three quantized
    expert stacks, read in place (no copy): ``gate``, ``up``
    ``(qtype, data, scales, n)`` as ``QuantWeights``' parts of ``n = E * I``
    rows of ``H`` features, ``down`` of ``E * H`` rows of ``I``;
    ``num_experts`` ``E``. Raises ValueError as ``QuantWeights`` does, or on
    stacks that do not split into ``E`` experts."""

    @property
    def num_experts(self) -> int: ...
    @property
    def hidden(self) -> int: ...
    @property
    def intermediate(self) -> int: ...
    @property
    def nbytes(self) -> int:
        """Bytes of the stacks' data and scales."""
    def __new__(
        cls, gate: _PartSpec, up: _PartSpec, down: _PartSpec, num_experts: int
    ) -> QuantExperts: ...
    def forward(
        self,
        x: npt.NDArray[np.float32],
        ids: npt.NDArray[np.int64],
        weights: npt.NDArray[np.float32],
        out: npt.NDArray[np.float32],
        num_threads: int = 1,
        isa: str | None = None,
        activations: str = "int16",
    ) -> None:
        """``out[t] = sum_j weights[t, j] * expert_{ids[t, j]}(x[t])``
        (``x``, ``out`` float32 ``[T, H]``, ``ids`` int64 and ``weights``
        float32 ``[T, k]``), each expert ``down(silu(gate x) * up x)``
        (torch's ``silu`` bit for bit), summed per token in ascending expert
        id; activations quantized as ``QuantWeights.forward``'s. Raises
        ValueError on wrong dtypes or shapes, an expert id outside
        ``0 .. E - 1``, a variant this CPU does not run, or another
        ``activations``."""

def quant_silu_mul(
    g: npt.NDArray[np.float32], up: npt.NDArray[np.float32], out: npt.NDArray[np.float32]
) -> None:
    """``out = silu(g) * up`` (float32 ``[N]``) as ``QuantExperts.forward``
    computes it: torch's CPU ``silu`` of float32 bit for bit. Raises
    ValueError on arrays of different lengths."""

def rotate_half(
    x: npt.NDArray[np.float32],
    x_stride: int,
    cos: npt.NDArray[np.float32],
    sin: npt.NDArray[np.float32],
    heads: int,
    dim: int,
    rot: int,
    out: npt.NDArray[np.float32],
    num_threads: int = 1,
) -> None:
    """Rotary embedding by a half table of every head of each row: row ``t``
    of ``x`` at ``x[t * x_stride:][:heads * dim]``, ``cos`` / ``sin``
    float32 ``[rows * rot / 2]``, into ``out`` float32 ``[rows * heads *
    dim]``; head ``[x1, x2, rest]`` becomes ``[x1 c - x2 s, x2 c + x1 s,
    rest]`` with torch's roundings (``RotaryTable.rotate``). Raises
    ValueError on an odd ``rot`` or one over ``dim``, or arrays too short."""

def quant_isas() -> list[str]:
    """The quantized kernels' variants this CPU runs, fastest first
    ("amx_int8", "avx512_vnni", "avx2", "portable"); each gives the same bits."""

def dequantize(
    qtype: str,
    data: npt.NDArray[np.uint8],
    scales: npt.NDArray[np.float32] | None,
    k: int,
) -> npt.NDArray[np.float32]:
    """float32 ``[n, k]``: the values of a quantized weight's rows, ``data``
    uint8 ``[n, row_bytes]`` in ``qtype``'s blocks (int8: ``scales`` float32
    ``[n]``), bit for bit gguf-py's ``quants.dequantize`` (ggml's formulas).
    Raises ValueError on an unknown format or wrong shapes."""

def quant_repack(
    qtype: str, data: npt.NDArray[np.uint8], in_features: int
) -> npt.NDArray[np.uint8]:
    """The panel layout of a ``[n, in_features]`` weight of ``qtype`` ("Q4_0",
    "Q4_1", "Q5_0", "Q5_1", "Q8_0"; ``data`` C-contiguous uint8 ``[n, row_bytes]``, the
    file's blocks): uint8 ``[ceil(n / 16) * 16, row_bytes]``, groups of 16
    outputs interleaved per 32-value block. Raises ValueError on another
    format, a ``k`` not a multiple of 32, or data of another shape."""

def quant_unpack_rows(
    qtype: str,
    panels: npt.NDArray[np.uint8],
    n: int,
    in_features: int,
    rows: npt.NDArray[np.int64],
) -> npt.NDArray[np.uint8]:
    """The file's bytes of rows ``rows`` (int64 ``[R]``, each in ``0..n``) of a
    panel weight: uint8 ``[R, row_bytes]``. Raises ValueError on another
    format, panels of another size, or a row outside ``0..n``."""

def dense_linear(
    x: npt.NDArray[np.float32],
    weight: npt.NDArray[np.float32],
    out: npt.NDArray[np.float32],
    bias: npt.NDArray[np.float32] | None = None,
    num_threads: int = 1,
    isa: str | None = None,
) -> None:
    """``out = x @ weight^T (+ bias)`` in float32, batch-invariant: each
    output's bits depend on its row of ``x`` and its row of ``weight`` alone
    (a fixed order of fused multiply-adds; ``rust/pagedrs-kernels/src/dense``), not on the
    number of rows, their order, the thread count or ``isa``. ``x``
    ``[M, K]``, ``weight`` ``[N, K]`` (read in place), ``out`` writable
    ``[M, N]``, ``bias`` ``[N]``; all C-contiguous float32. ``isa`` one of
    ``dense_isas()`` (None: the fastest). Raises ValueError naming the array
    on a wrong dtype, layout or shape, or a variant this CPU does not run."""

def dense_isas() -> list[str]:
    """The dense kernel's variants this CPU runs, fastest first ("avx2",
    "portable"); each gives the same bits."""

def paged_decode_attention(
    query: npt.NDArray[np.float32] | npt.NDArray[np.int16],
    key_cache: npt.NDArray[Any],
    value_cache: npt.NDArray[Any],
    block_tables: npt.NDArray[np.int32],
    seq_lens: npt.NDArray[np.int32],
    scale: float,
    out: npt.NDArray[np.float32] | npt.NDArray[np.int16],
    num_threads: int = 1,
    *,
    sliding_window: int | None = None,
    softcap: float | None = None,
    sinks: npt.NDArray[np.float32] | None = None,
    kv_cache_dtype: str = "float32",
    query_rows: npt.NDArray[np.int32] | None = None,
) -> None:
    """Decode attention of one query token per sequence over its paged context
    (``[S, Hq, D]`` query and out, float32 or int16 holding bfloat16 bits;
    ``[N, Hkv, bs, E]`` caches in ``kv_cache_dtype``'s numpy dtype: float32,
    int16 (bfloat16 bits), int8 (``E = D + 2``: values, then the entry's
    bfloat16 scale) or uint8 (fp8 bits)): all of it or its last
    ``sliding_window`` tokens, with an optional logit soft cap and per query
    head sink logits (float32 ``[Hq]``). With ``query_rows`` (int32 ``[Q]``,
    the block-table row of each query), ``Q`` query tokens with ``seq_lens``
    ``[Q]`` = their positions + 1: a prefill chunk, each token attending to
    the cached tokens up to itself exactly as its decode would. Raises
    ValueError on an unknown format, wrong dtypes or inconsistent shapes."""

def write_kv(
    key: npt.NDArray[np.float32] | npt.NDArray[np.int16],
    value: npt.NDArray[np.float32] | npt.NDArray[np.int16],
    key_cache: npt.NDArray[Any],
    value_cache: npt.NDArray[Any],
    slot_mapping: npt.NDArray[np.int64],
    *,
    kv_cache_dtype: str = "float32",
) -> None:
    """Store new K/V ``[T, Hkv, D]`` (float32 or bfloat16 bits) into their
    slots (slots < 0 skipped) in ``kv_cache_dtype``'s format ("float32",
    "bfloat16", "int8", "fp8_e4m3", "fp8_e5m2"; as ``paged_decode_attention``)."""

def lora_add(
    x: npt.NDArray[np.float32],
    out: npt.NDArray[np.float32],
    slots: npt.NDArray[np.int32],
    lora_a: npt.NDArray[np.float32],
    lora_b: npt.NDArray[np.float32],
    ranks: npt.NDArray[np.int32],
    scalings: npt.NDArray[np.float32],
    out_col: int = 0,
    num_threads: int = 1,
    isa: str | None = None,
) -> None:
    """``out[t, out_col:out_col + N] += scalings[l] * (x[t] @ A_l^T) @ B_l^T``
    for each token ``t`` of slot ``l = slots[t] >= 0`` (float32, batch-invariant;
    ``rust/pagedrs-kernels/src/lora``). ``x`` ``[T, K]``, ``out`` ``[T, W]``, ``lora_a``
    ``[L, R, K]`` and ``lora_b`` ``[L, N, R]`` with slot ``l``'s matrices in
    its first ``ranks[l] * K`` / ``N * ranks[l]`` floats, ``ranks`` int32
    ``[L]``, ``scalings`` float32 ``[L]``.

    Raises:
        ValueError: naming the array, on a dtype or shape that does not match,
            a slot or rank out of range, or an unknown variant.
    """

def lora_isas() -> list[str]:
    """The LoRA kernel's variants this CPU runs, fastest first."""
