"""Megatron-style sharding of a Llama-family HF model across tensor-parallel ranks.

Attention is split by KV-head groups: rank r keeps a contiguous run of KV heads
and the query heads that read them (q/k/v projections split by output rows,
o_proj by input columns); the MLP's gate/up projections are split by rows and
down_proj by columns. Each row-split layer's partial outputs are summed with an
all-reduce. Embeddings, norms and the LM head stay whole on every rank. A
rank's KV cache holds only its own KV heads, so with N ranks each holds 1/N of
the KV memory (when the KV heads divide evenly).

Quantized weights (GGUF blocks kept as the file stores them,
``quantization="int8"``) are not sharded: ``refuse_quantized`` names the first
quantized module, and both the engine and ``shard_llama`` call it first.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from transformers import PreTrainedModel

from ..executor.model_support import check_tensor_parallel
from ..executor.quant.modules import QuantizedEmbedding, QuantizedLinearModule


def refuse_quantized(model: nn.Module, world: int) -> None:
    """Raise if ``model`` holds quantized weights (``QuantizedLinearModule``,
    ``QuantizedEmbedding``): tensor parallelism shards float weights only.

    Raises:
        ValueError: naming ``tensor_parallel_size``, the first quantized
            module, its class and its format (e.g. ``Q4_K``, ``int8``).
    """
    for name, module in model.named_modules():
        if isinstance(module, (QuantizedLinearModule, QuantizedEmbedding)):
            raise ValueError(
                f"tensor_parallel_size={world}: {name} ({type(module).__name__}) holds "
                f"{module.qweight.qtype} quantized weights, which pagedrs does not shard "
                "across ranks; run it with tensor_parallel_size=1, or load a float "
                "checkpoint without quantization"
            )


def kv_head_range(num_kv_heads: int, rank: int, world: int) -> tuple[int, int]:
    """``[start, end)`` of the KV heads owned by ``rank`` (as even as possible).

    Raises:
        ValueError: more ranks than KV heads.
    """
    if world > num_kv_heads:
        raise ValueError(
            f"tensor_parallel_size={world} exceeds the model's {num_kv_heads} KV heads"
        )
    chunks = np.array_split(np.arange(num_kv_heads), world)
    return int(chunks[rank][0]), int(chunks[rank][-1]) + 1


class RowParallelLinear(nn.Module):
    """A linear layer holding a slice of the input features; outputs are summed
    over ranks (all-reduce). The bias, if any, is added once, after the sum."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = nn.functional.linear(x, self.weight)
        dist.all_reduce(out)
        return out if self.bias is None else out + self.bias


def _rows(linear: nn.Linear, start: int, end: int) -> nn.Linear:
    """A new linear layer keeping output rows ``[start, end)``."""
    new = nn.Linear(linear.in_features, end - start, bias=linear.bias is not None)
    new.weight = nn.Parameter(linear.weight[start:end].clone(), requires_grad=False)
    if linear.bias is not None:
        new.bias = nn.Parameter(linear.bias[start:end].clone(), requires_grad=False)
    return new.to(linear.weight.device)


def _cols(linear: nn.Linear, start: int, end: int) -> RowParallelLinear:
    """A row-parallel layer keeping input columns ``[start, end)``."""
    bias = None if linear.bias is None else linear.bias.detach().clone()
    return RowParallelLinear(linear.weight[:, start:end].clone(), bias)


def shard_llama(model: PreTrainedModel, rank: int, world: int) -> int:
    """Shard every decoder layer of ``model`` in place for ``rank`` of ``world``.

    Returns:
        the number of KV heads this rank keeps.
    Raises:
        ValueError: a layout this sharding does not handle, an architecture
            outside ``model_support.TENSOR_PARALLEL_MODEL_TYPES``, or quantized
            weights (``refuse_quantized``).
    """
    config = model.config
    check_tensor_parallel(config, world)
    refuse_quantized(model, world)
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    group = heads // kv_heads
    k0, k1 = kv_head_range(kv_heads, rank, world)
    q0, q1 = k0 * group, k1 * group
    inter = np.array_split(np.arange(config.intermediate_size), world)[rank]
    i0, i1 = int(inter[0]), int(inter[-1]) + 1
    for layer in model.get_decoder().layers:
        attn, mlp = layer.self_attn, layer.mlp
        attn.q_proj = _rows(attn.q_proj, q0 * head_dim, q1 * head_dim)
        attn.k_proj = _rows(attn.k_proj, k0 * head_dim, k1 * head_dim)
        attn.v_proj = _rows(attn.v_proj, k0 * head_dim, k1 * head_dim)
        attn.o_proj = _cols(attn.o_proj, q0 * head_dim, q1 * head_dim)
        mlp.gate_proj = _rows(mlp.gate_proj, i0, i1)
        mlp.up_proj = _rows(mlp.up_proj, i0, i1)
        mlp.down_proj = _cols(mlp.down_proj, i0, i1)
    return k1 - k0
