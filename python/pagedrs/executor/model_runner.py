"""Runs one engine step through the model on the paged KV cache."""

from __future__ import annotations

import numpy as np
import torch
from transformers import PreTrainedModel

from ..attention import torch_ops
from ..attention.forward_context import ForwardContext, set_forward_context
from ..attention.metadata import AttentionMetadata
from .kv_cache import KVCacheSpec
from .models import PagedLlamaModel, supports_native


class ModelRunner:
    """Owns the model and its KV cache tensors; turns step arrays into logits.

    Args:
        model: an HF causal LM loaded with ``attn_implementation="pagedrs"``.
        spec: KV cache shape.
        num_blocks: physical blocks to allocate.
        device: where model and cache live.
        use_triton: run the Triton kernels (GPU).
        num_cpu_blocks: blocks of the CPU swap pool (same layout, host memory).
        model_impl: "auto" (pagedrs' own code where the family has one, else
            HF's modules), "pagedrs" or "transformers".
        max_model_len: longest sequence, tokens (sizes the rotary tables).
        torch_attention: without Triton, attend with the plain torch reference
            path instead of the Rust CPU kernels.
    Raises:
        ValueError: ``model_impl="pagedrs"`` for a family without native code.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        spec: KVCacheSpec,
        num_blocks: int,
        device: torch.device,
        use_triton: bool = False,
        num_cpu_blocks: int = 0,
        model_impl: str = "auto",
        max_model_len: int | None = None,
        torch_attention: bool = False,
    ) -> None:
        self.model = model
        self.spec = spec
        self.device = device
        self.use_triton = use_triton
        self.attention = "triton" if use_triton else "torch" if torch_attention else "cpu"
        self.kv_caches = spec.allocate(num_blocks, device)
        self.cpu_caches = spec.allocate(num_cpu_blocks, torch.device("cpu"))
        self.decoder = model.get_decoder()
        self.lm_head = model.get_output_embeddings()
        self.native: PagedLlamaModel | None = None
        if model_impl == "pagedrs" or (model_impl == "auto" and supports_native(model)):
            positions = max_model_len or model.config.max_position_embeddings
            self.native = PagedLlamaModel(model, positions)

    @torch.inference_mode()
    def apply_block_moves(self, step: dict[str, np.ndarray]) -> None:
        """Apply the step's block moves before its forward pass, in order:
        swap out (device -> CPU), swap in (CPU -> device), copy-on-write copies.

        Args:
            step: reads ``swap_out``, ``swap_in``, ``block_copies``, int64 ``[M, 2]``.
        """
        for key, (src_caches, dst_caches) in (
            ("swap_out", (self.kv_caches, self.cpu_caches)),
            ("swap_in", (self.cpu_caches, self.kv_caches)),
        ):
            pairs = step[key]
            if len(pairs):
                src = torch.from_numpy(pairs[:, 0])
                dst = torch.from_numpy(pairs[:, 1])
                for (sk, sv), (dk, dv) in zip(src_caches, dst_caches, strict=True):
                    dk[dst.to(dk.device)] = sk[src.to(sk.device)].to(dk.device)
                    dv[dst.to(dv.device)] = sv[src.to(sv.device)].to(dv.device)
        copies = step["block_copies"]
        if len(copies):
            mapping = torch.from_numpy(copies).to(self.device)
            keys = [k for k, _ in self.kv_caches]
            values = [v for _, v in self.kv_caches]
            if self.use_triton:
                from .. import kernels

                kernels.copy_blocks(keys, values, mapping)
            else:
                torch_ops.copy_blocks(keys, values, mapping)

    @torch.inference_mode()
    def execute(
        self, step: dict[str, np.ndarray], extra_rows: np.ndarray | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Forward the step's tokens and return the logits of its sampled rows.

        Args:
            step: arrays from ``pagedrs._core.Scheduler.schedule()``.
            extra_rows: int ``[E]`` more token rows whose logits are wanted
                (prompt logprobs), or None.
        Returns:
            float32 ``[R, vocab]`` logits, one row per ``step["logits_indices"]``,
            and float32 ``[E, vocab]`` logits of ``extra_rows`` (or None).
        """
        meta = AttentionMetadata.from_step(step, self.device)
        input_ids = torch.from_numpy(step["input_ids"]).to(self.device)
        positions = torch.from_numpy(step["positions"]).to(self.device)
        if self.native is not None:
            hidden = self.native.forward(input_ids, positions, meta, self.kv_caches, self.attention)
            logits_of = self.native.compute_logits
        else:
            ctx = ForwardContext(self.kv_caches, meta, self.attention)
            with set_forward_context(ctx):
                hidden = self.decoder(
                    input_ids=input_ids[None], position_ids=positions[None], use_cache=False
                ).last_hidden_state[0]

            def logits_of(h: torch.Tensor) -> torch.Tensor:
                return self.lm_head(h).float()

        rows = torch.from_numpy(step["logits_indices"]).to(self.device)
        extra = None
        if extra_rows is not None:
            extra = logits_of(hidden[torch.from_numpy(extra_rows).to(self.device)])
        return logits_of(hidden[rows]), extra
