"""Runs one engine step through the model on the paged KV cache."""

from __future__ import annotations

import numpy as np
import torch
from transformers import PreTrainedModel

from .._core import BlockMoves, StepBatch
from ..attention.backends import get_attention_backend
from ..attention.forward_context import ForwardContext, set_forward_context
from ..attention.metadata import AttentionMetadata
from .kv_cache import KVCacheSpec
from .model_support import logits_transform
from .models import PagedLlamaModel, supports_native


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
    Raises:
        ValueError: ``model_impl="pagedrs"`` for a family without native code
            or a spec of sliding-window groups, or a backend that cannot run
            the KV cache dtype for the model dtype on ``device``.
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
    ) -> None:
        self.model = model
        self.spec = spec
        self.device = device
        self.attention = get_attention_backend(attention_backend)
        self.attention.check(spec.cache_dtype, spec.dtype, device)
        # The pool's unique tensor pairs (block moves apply to these, once)
        # and each model layer's view of them (its KV cache group's pair).
        self.kv_caches = spec.allocate(num_blocks, device)
        self.cpu_caches = spec.allocate(num_cpu_blocks, torch.device("cpu"))
        self.layer_kv_caches = spec.layer_caches(self.kv_caches)
        self.layer_groups = spec.layer_groups
        self.group_windows = spec.sliding_windows
        self.decoder = model.get_decoder()
        self.lm_head = model.get_output_embeddings()
        # What the model's own forward applies after its LM head (scaling, softcap).
        self.logits_transform = logits_transform(model.config)
        self.native: PagedLlamaModel | None = None
        if model_impl == "pagedrs" or (model_impl == "auto" and supports_native(model)):
            positions = max_model_len or model.config.max_position_embeddings
            self.native = PagedLlamaModel(model, positions)
            # Native families have no sliding windows: one group of all layers.
            if len(spec.groups) != 1 or spec.groups[0].sliding_window is not None:
                raise ValueError(
                    "pagedrs' own Llama-family code runs one full-attention KV cache "
                    f"group, not {spec.describe()}; use model_impl='transformers'"
                )

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
            float32 ``[R, vocab]`` logits, one row per ``batch.logits_indices``,
            and float32 ``[E, vocab]`` logits of ``extra_rows`` (or None); both
            as the model's own forward computes them (after the LM head it
            applies ``model_support.logits_transform``).
        """
        if len(batch.kv_groups) != len(self.group_windows):
            raise ValueError(
                f"the step has {len(batch.kv_groups)} KV cache groups, the runner "
                f"{len(self.group_windows)}"
            )
        meta = AttentionMetadata.for_groups(batch, self.device)
        input_ids = torch.from_numpy(batch.input_ids).to(self.device)
        positions = torch.from_numpy(batch.positions).to(self.device)
        if self.native is not None:
            hidden = self.native.forward(
                input_ids, positions, meta[0], self.layer_kv_caches, self.attention
            )
            head = self.native.compute_logits
        else:
            ctx = ForwardContext(
                self.layer_kv_caches, meta, self.attention, self.layer_groups, self.group_windows
            )
            with set_forward_context(ctx):
                hidden = self.decoder(
                    input_ids=input_ids[None], position_ids=positions[None], use_cache=False
                ).last_hidden_state[0]

            def head(h: torch.Tensor) -> torch.Tensor:
                return self.lm_head(h).float()

        transform = self.logits_transform

        def logits_of(h: torch.Tensor) -> torch.Tensor:
            logits = head(h)
            return logits if transform is None else transform(logits)

        rows = torch.from_numpy(batch.logits_indices).to(self.device)
        extra = None
        if extra_rows is not None:
            extra = logits_of(hidden[torch.from_numpy(extra_rows).to(self.device)])
        return logits_of(hidden[rows]), extra

    def close(self) -> None:
        """Nothing to release in process (the caches go with the runner)."""
