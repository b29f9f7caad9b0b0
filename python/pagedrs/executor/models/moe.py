"""Mixtures of experts on packed steps: Qwen3-MoE and Qwen2-MoE.

Attention is the decoder's (Qwen3-MoE with Qwen3's q/k norms, Qwen2-MoE
with Qwen2's q/k/v biases). A sparse layer's MLP is ``SparseMoe``, the
operations of HF's ``Qwen3MoeSparseMoeBlock`` / ``Qwen2MoeSparseMoeBlock``
and their routers in their order: the router's logits (a float projection),
softmax in float32, each token's top-k experts, their probabilities
renormalized where the config says so (``norm_topk_prob``), then HF's
experts module on the whole step's rows (``QuantizedExperts`` for a GGUF
file: each hit expert's weights read once per step, one Rust call per
layer); Qwen2-MoE adds its shared expert, scaled by the sigmoid of its gate.
A token's experts do not depend on the rest of its step: a float32 CPU
router and gate run the batch-invariant dense kernel whatever the model's
flag; the gate's sigmoid is computed in float64 (``_sigmoid``: its float32
result independent of the step but for values at a rounding boundary).
Layers listed in ``mlp_only_layers`` (or off ``decoder_sparse_step``) keep
a dense MLP and run as the decoder's.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from .decoder import DecoderLayer, LayerStep, PagedDecoderModel
from .linear import Linear
from .ops import gate_activation
from .projections import Projection, projection, single
from .qwen3 import PagedQwen3Model


def is_sparse(mlp: nn.Module) -> bool:
    """Whether HF's MLP module ``mlp`` is a sparse-MoE block (a router
    ``gate`` and an ``experts`` module)."""
    return hasattr(mlp, "experts") and hasattr(getattr(mlp, "gate", None), "top_k")


def _exact(weight: torch.Tensor | None) -> bool:
    """Whether a router-sized float weight runs batch-invariant whatever the
    model's flag: float32 on CPU (the dense kernel), so that a token's
    experts and shared-expert scale never depend on the rest of its step
    (a quantized one is batch-invariant already; None)."""
    return weight is not None and weight.dtype == torch.float32 and weight.device.type == "cpu"


def _sigmoid(x: torch.Tensor) -> torch.Tensor:
    """``sigmoid(x)`` computed in float64 and rounded to ``x``'s dtype.

    torch's CPU sigmoid runs a vectorized formula over whole vectors of a
    tensor and a scalar one over the rest, which round differently in
    float32 (3 of 250 rows of a ``[250, 1]`` gate differed from the same
    row alone): a token's shared-expert scale would depend on its place in
    the step. In float64 the two formulas agree to within a unit in the
    last place of a double, so their float32 roundings differ only for a
    value within that distance of a float32 rounding boundary (about one in
    2^29); none did in the tests' steps.
    """
    return torch.sigmoid(x.double()).to(x.dtype)


class SparseMoe:
    """One sparse-MoE MLP (module docs).

    Args:
        mlp: HF's sparse block: ``gate``, the router (``weight`` ``[E, H]``,
            ``top_k``, ``norm_topk_prob``); ``experts``, called as HF's block
            calls it; Qwen2-MoE's ``shared_expert`` (a gated MLP) and
            ``shared_expert_gate`` (``[1, H]``).
        batch_invariant: the float projections batch-invariant
            (``linear.Linear``'s flag); a float32 CPU router and shared-expert
            gate are batch-invariant always.
    """

    def __init__(self, mlp: Any, batch_invariant: bool) -> None:
        router = mlp.gate
        self.router = Linear(
            router.weight, None, batch_invariant=batch_invariant or _exact(router.weight)
        )
        self.top_k = int(router.top_k)
        self.norm_topk_prob = bool(router.norm_topk_prob)
        self.experts = mlp.experts
        self.shared: tuple[Projection, Projection, Any, Projection] | None = None
        shared = getattr(mlp, "shared_expert", None)
        if shared is not None:
            gate_up = projection(shared, ["gate_proj", "up_proj"], batch_invariant)[0]
            down = projection(shared, ["down_proj"], batch_invariant)[0]
            act = gate_activation(shared.act_fn)
            assert act is not None  # supports_mlp checked it
            gate_module = mlp.shared_expert_gate
            gate = single(
                gate_module,
                batch_invariant or _exact(getattr(gate_module, "weight", None)),
            )
            self.shared = (gate_up, down, act, gate)

    def projections(self) -> list[Projection]:
        """The router's and the shared expert's projections."""
        return [self.router, *([] if self.shared is None else [*self.shared[:2], self.shared[3]])]

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        """``[T, H]`` MLP output of the normed hidden rows ``h`` ``[T, H]``."""
        logits = self.router(h)
        probs = F.softmax(logits, dtype=torch.float, dim=-1)
        top, index = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            top /= top.sum(dim=-1, keepdim=True)
        out: torch.Tensor = self.experts(h, index, top.to(logits.dtype))
        if self.shared is not None:
            gate_up, down, act, gate = self.shared
            g, u = gate_up(h).chunk(2, dim=-1)
            out = out + _sigmoid(gate(h)) * down(act(g).mul_(u))
        return out


class MoeDecoderLayer(DecoderLayer):
    """A decoder layer whose MLP may be a ``SparseMoe`` (``moe``; None for a
    dense MLP, which runs as the decoder's). A sparse layer has no fused
    gate/up or down projection (``gate_up_names`` empty)."""

    moe: SparseMoe | None = None

    def init_mlp(self, mlp: Any, batch_invariant: bool) -> None:
        if not is_sparse(mlp):
            super().init_mlp(mlp, batch_invariant)
            return
        self.moe = SparseMoe(mlp, batch_invariant)
        self.gate_up_names = ()

    def projections(self) -> list[Projection]:
        if self.moe is None:
            return super().projections()
        return [self.qkv, self.o_proj, *self.moe.projections()]


class MoeFamily(PagedDecoderModel):
    """What the MoE families add to the decoder: sparse layers' MLPs."""

    layer_class: ClassVar[type[DecoderLayer]] = MoeDecoderLayer

    @classmethod
    def supports_mlp(cls, mlp: nn.Module) -> bool:
        if not is_sparse(mlp):
            return super().supports_mlp(mlp)
        experts: Any = mlp.experts
        act = getattr(experts, "act_fn", None)
        if not isinstance(act, nn.Module) or gate_activation(act) is None:
            return False
        shared: Any = getattr(mlp, "shared_expert", None)
        return shared is None or (
            hasattr(mlp, "shared_expert_gate") and super().supports_mlp(shared)
        )

    def layer_forward(self, layer: DecoderLayer, x: torch.Tensor, step: LayerStep) -> torch.Tensor:
        """The decoder's layer, the sparse MLP's output added to the residual."""
        moe = layer.moe if isinstance(layer, MoeDecoderLayer) else None
        if moe is None:
            return super().layer_forward(layer, x, step)
        attn = self.attend(layer, layer.input_norm(x), step)
        x = layer.o_proj.add_to(x, attn)
        return x + moe(layer.post_norm(x))


class PagedQwen3MoeModel(MoeFamily, PagedQwen3Model):
    """Qwen3-MoE (``decoder.PagedDecoderModel``'s arguments)."""

    model_types = ("qwen3_moe",)


class PagedQwen2MoeModel(MoeFamily):
    """Qwen2-MoE (``decoder.PagedDecoderModel``'s arguments)."""

    model_types = ("qwen2_moe",)
