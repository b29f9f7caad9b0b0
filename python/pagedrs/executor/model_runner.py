"""Runs one engine step through the model on the paged KV cache."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedModel

from .._core import BlockMoves, KVCacheGroupBatch, StepBatch
from ..attention.backends import get_attention_backend
from ..attention.forward_context import ForwardContext, set_forward_context
from ..attention.metadata import AttentionMetadata
from .batch_invariant import make_batch_invariant
from .cuda_graphs import DecodeGraphs, GraphCapturer, capture_sizes, try_capture
from .heap import keep_freed_memory
from .kv_cache import KVCacheSpec
from .model_support import logits_transform
from .models import PagedDecoderModel, native_model, supports_native
from .sampler import greedy_rows


class ModelRunner:
    """Owns the model and its KV cache tensors; turns step batches into logits
    (the in-process ``Executor``).

    Args:
        model: an HF causal LM loaded with ``attn_implementation="pagedrs"``.
        spec: KV cache shape and groups.
        num_blocks: physical blocks to allocate.
        device: where model and cache live.
        attention_backend: "cpu" (Rust kernels), "torch" or "triton", as
            resolved by ``EngineArgs.resolved_attention_backend()``.
        num_cpu_blocks: blocks of the CPU swap pool (same layout, host memory).
        model_impl: "auto" (pagedrs' own code where the family has one, else
            HF's modules), "pagedrs" or "transformers".
        max_model_len: longest sequence, tokens (sizes the rotary tables).
        batch_invariant: every float projection, the LM head included,
            batch-invariant (``EngineArgs.batch_invariant``): the native
            code's ``Linear`` with the flag, or HF's ``nn.Linear`` modules
            replaced (``batch_invariant.make_batch_invariant``).
    Raises:
        ValueError: ``model_impl="pagedrs"`` for a model without native code
            (``models.supports_native``), a layer in a sliding-window group of
            another window than its own, or a backend that cannot run
            the KV cache dtype for the model dtype on ``device``, or
            ``batch_invariant`` for a model it cannot hold for (naming the
            module or weight).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        spec: KVCacheSpec,
        num_blocks: int,
        device: torch.device,
        attention_backend: str = "torch",
        num_cpu_blocks: int = 0,
        model_impl: str = "auto",
        max_model_len: int | None = None,
        batch_invariant: bool = False,
    ) -> None:
        native = model_impl == "pagedrs" or (model_impl == "auto" and supports_native(model))
        if batch_invariant and not native:
            make_batch_invariant(model)
        self.model = model
        self.spec = spec
        self.device = device
        self.attention = get_attention_backend(attention_backend)
        self.attention.check(spec.cache_dtype, spec.dtype, device)
        # The pool's unique tensor pairs (block moves apply to these, once)
        # and each model layer's view of them (its KV cache group's pair).
        self.kv_caches = spec.allocate(num_blocks, device)
        self.cpu_caches = spec.allocate(num_cpu_blocks, torch.device("cpu"))
        # The spec may hold layers past the model's (a draft model's group,
        # ``spec_decode.draft_model``): the model's own layers come first.
        self.num_model_layers = int(model.config.num_hidden_layers)
        self.layer_kv_caches = spec.layer_caches(self.kv_caches)[: self.num_model_layers]
        self.layer_groups = spec.layer_groups
        self.group_windows = spec.sliding_windows
        self.decoder = model.get_decoder()
        self.lm_head = model.get_output_embeddings()
        # What the model's own forward applies after its LM head (scaling, softcap).
        self.logits_transform = logits_transform(model.config)
        self.graphs: DecodeGraphs | None = None  # capture_cuda_graphs()
        self.lora: Any = None  # LoRA (pagedrs.lora): its LoRAModelManager, with enable_lora
        self.native: PagedDecoderModel | None = None
        if native:
            positions = max_model_len or model.config.max_position_embeddings
            self.native = native_model(
                model,
                positions,
                batch_invariant=batch_invariant,
                layer_groups=self.layer_groups[: self.num_model_layers],
                group_windows=self.group_windows,
            )
            # Its packed LM head may stand in HF's place (``models.linear``).
            self.lm_head = model.get_output_embeddings()
        if device.type == "cpu":
            # Weights and cache are allocated: the steps' buffers stay in the
            # heap from here on (``heap``).
            keep_freed_memory()

    @property
    def kv_cache_spec(self) -> KVCacheSpec:
        """Shape and dtype of this runner's KV cache."""
        return self.spec

    @torch.inference_mode()
    def apply_block_moves(self, moves: BlockMoves) -> None:
        """Apply the step's block moves before its forward pass, in order:
        swap out (device -> CPU), swap in (CPU -> device), copy-on-write copies
        (each int64 ``[M, 2]``), to each of the pool's tensor pairs once (a
        block id moves every layer of the group that holds it)."""
        if len(moves.swap_out):
            pairs = torch.from_numpy(moves.swap_out)
            self.attention.swap_blocks(self.kv_caches, self.cpu_caches, pairs)
        if len(moves.swap_in):
            pairs = torch.from_numpy(moves.swap_in)
            self.attention.swap_blocks(self.cpu_caches, self.kv_caches, pairs)
        if len(moves.copies):
            mapping = torch.from_numpy(moves.copies).to(self.device)
            self.attention.copy_blocks(self.kv_caches, mapping)

    def _forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: list[AttentionMetadata]
    ) -> torch.Tensor:
        """Hidden states ``[T, H]`` of the step's tokens (int64 ``[T]`` ids and
        positions) over the paged KV cache, ``meta`` one per KV cache group."""
        if self.native is not None:
            return self.native.forward(
                input_ids, positions, meta, self.layer_kv_caches, self.attention
            )
        ctx = ForwardContext(
            self.layer_kv_caches, meta, self.attention, self.layer_groups, self.group_windows
        )
        with set_forward_context(ctx):
            return self.decoder(
                input_ids=input_ids[None], position_ids=positions[None], use_cache=False
            ).last_hidden_state[0]

    @torch.inference_mode()
    def capture_cuda_graphs(
        self,
        max_num_seqs: int,
        max_model_len: int,
        capturer: GraphCapturer | None = None,
        sizes: list[int] | None = None,
    ) -> bool:
        """Capture decode steps of up to ``max_num_seqs`` sequences as graphs
        (``cuda_graphs``), after the KV cache has its final size (graphs hold
        its addresses). On a failed capture steps stay eager.

        Args:
            capturer: the ``GraphCapturer`` (default: ``torch.cuda.CUDAGraph``).
            sizes: batch-size buckets (default: ``capture_sizes(max_num_seqs)``).
        Returns:
            Whether graphs are in use.
        """
        widths = [-(-max_model_len // self.spec.block_size)] * len(self.group_windows)
        self.graphs = try_capture(
            self._forward, widths, sizes or capture_sizes(max_num_seqs), self.device, capturer
        )
        return self.graphs is not None

    @torch.inference_mode()
    def execute(
        self, batch: StepBatch, extra_rows: np.ndarray | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Forward the batch's tokens and return the logits of its sampled rows.

        Args:
            batch: the step's model inputs (``pagedrs._core.StepBatch``).
            extra_rows: int ``[E]`` more token rows whose logits are wanted
                (prompt logprobs), or None.
        Returns:
            ``[R + D, vocab]`` logits, one row per ``batch.spec_logits_indices``
            (``batch.logits_indices`` when the step has no draft tokens; with
            drafts, each row's ``num_draft_tokens + 1`` verified positions), and
            ``[E, vocab]`` logits of ``extra_rows`` (or None); both as the
            model's own forward computes them: in the model dtype (upcast by
            their readers: a greedy argmax needs no upcast), or float32 after
            ``model_support.logits_transform`` when the model has one.
        """
        if len(batch.kv_groups) != len(self.group_windows):
            raise ValueError(
                f"the step has {len(batch.kv_groups)} KV cache groups, the runner "
                f"{len(self.group_windows)}"
            )
        if self.lora is not None:  # LoRA (pagedrs.lora): each token's adapter slot
            self.lora.set_step(batch)
        if self.graphs is not None and self.graphs.can_run(batch):
            hidden = self.graphs.run(batch)
        else:
            meta = AttentionMetadata.for_groups(batch, self.device)
            input_ids = torch.from_numpy(batch.input_ids).to(self.device)
            positions = torch.from_numpy(batch.positions).to(self.device)
            hidden = self._forward(input_ids, positions, meta)
        head: Callable[[torch.Tensor], torch.Tensor] = (
            self.native.compute_logits if self.native is not None else self.lm_head
        )

        transform = self.logits_transform

        def logits_of(h: torch.Tensor) -> torch.Tensor:
            logits = head(h)
            return logits if transform is None else transform(logits.float())

        rows = torch.from_numpy(batch.spec_logits_indices).to(self.device)
        extra = None
        if extra_rows is not None:
            extra = logits_of(hidden[torch.from_numpy(extra_rows).to(self.device)])
        return logits_of(hidden[rows]), extra

    @torch.inference_mode()
    def profile_run(self, num_tokens: int, max_num_seqs: int, max_model_len: int) -> None:
        """A forward of ``num_tokens`` prompt tokens (sequences of up to
        ``max_model_len`` tokens) and the logits of up to ``max_num_seqs`` rows:
        the largest step the scheduler can make, for ``memory_profile``. Its
        K/V go to the first blocks of the pool, which needs
        ``profile_blocks(num_tokens, max_model_len)`` blocks."""
        batch = profile_batch(
            num_tokens, max_num_seqs, max_model_len, self.spec.block_size, len(self.group_windows)
        )
        self.execute(batch)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def resize_kv_cache(self, num_blocks: int) -> None:
        """Reallocate the device KV cache with ``num_blocks`` blocks (its
        contents are not kept); before ``capture_cuda_graphs``."""
        if self.graphs is not None:
            raise RuntimeError("resize_kv_cache after capture_cuda_graphs")
        self.kv_caches = []
        self.layer_kv_caches = []
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        self.kv_caches = self.spec.allocate(num_blocks, self.device)
        self.layer_kv_caches = self.spec.layer_caches(self.kv_caches)[: self.num_model_layers]

    def close(self) -> None:
        """Nothing to release in process (the caches go with the runner)."""


def profile_blocks(num_tokens: int, max_model_len: int, block_size: int) -> int:
    """Blocks ``ModelRunner.profile_run`` writes to (its sequences share them)."""
    return -(-min(num_tokens, max_model_len) // block_size)


def profile_batch(
    num_tokens: int, max_num_seqs: int, max_model_len: int, block_size: int, num_groups: int
) -> StepBatch:
    """A prompt step of ``num_tokens`` tokens: sequences of
    ``min(num_tokens, max_model_len)`` tokens (the last one shorter), all over
    the same first blocks, logits for the last ``min(max_num_seqs,
    num_tokens)`` token rows."""
    length = min(num_tokens, max_model_len)
    lens = [length] * (num_tokens // length)
    if num_tokens % length:
        lens.append(num_tokens % length)
    table = np.arange(-(-length // block_size), dtype=np.int32)
    positions = np.concatenate([np.arange(n, dtype=np.int64) for n in lens])
    slots = table[positions // block_size].astype(np.int64) * block_size + positions % block_size
    tables = np.tile(table, (len(lens), 1))
    qsl = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    s, rows = len(lens), min(max_num_seqs, num_tokens)
    ids = np.arange(s, dtype=np.uint64)
    sample_ids = np.arange(rows, dtype=np.uint64)
    return StepBatch(
        input_ids=np.zeros(num_tokens, np.int64),
        positions=positions,
        query_start_loc=qsl,
        seq_lens=np.array(lens, np.int32),
        seq_request_ids=ids,
        kv_groups=[KVCacheGroupBatch(slots, tables) for _ in range(num_groups)],
        logits_indices=np.arange(num_tokens - rows, num_tokens, dtype=np.int64),
        sample_request_ids=sample_ids,
        **greedy_rows(rows),
    )
