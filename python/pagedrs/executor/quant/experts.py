"""A mixture of experts whose expert stacks stay quantized, in HF's experts
interface.

A GGUF MoE layer stores its experts as three 3-D tensors (llama.cpp's
``ffn_gate_exps`` / ``ffn_up_exps`` ``[E, I, H]`` and ``ffn_down_exps``
``[E, H, I]``, row-major blocks); viewed as 2-D ``[E * I, H]`` each expert is
a range of whole rows, so expert ``e``'s projections are
``QuantizedWeight.rows(e * I, I)``: views of the file's bytes, no copy.

``QuantizedExperts.forward`` takes what HF's sparse-MoE blocks pass their
``experts`` module (the tokens, each token's top-k expert ids and routing
weights) and groups the step's tokens by expert: each expert hit runs once
for all of its tokens, gate and up, the activation, then down, so each
expert's weights are read once per step whatever the number of tokens
routed to it. The routing weights scale each token's expert output and the
outputs are summed per token in expert order, as HF's own experts loop does.

On CPU, with float32 tokens and a SiLU gate (every GGUF MoE arch pagedrs
loads), the layer is one Rust call (``pagedrs._core.QuantExperts``,
``rust/pagedrs-kernels/src/quant/moe.rs``): the grouping, the hit experts'
gate/up and down projections each as one parallel loop over all hit
experts, torch's ``silu`` reproduced bit for bit, and the weighted sum.
``forward_per_expert`` is the same math as a Python loop over the hit
experts, one ``QuantizedLinear`` call per expert and projection; the two
give the same bits (``tests/kernels/test_quant_experts.py``), and the loop
runs whatever the one call does not (other devices, bfloat16 tokens, other
activations).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import SiLUActivation

import pagedrs._core as _core

from .linear import QuantizedLinear, _kernel_part, check_activations
from .weight import QuantizedWeight


class QuantizedExperts(nn.Module):
    """``E`` SwiGLU-style experts over quantized stacks.

    Args:
        gate: ``[E * I, H]``, expert ``e``'s gate rows ``e * I .. (e + 1) * I``.
        up: ``[E * I, H]``, likewise.
        down: ``[E * H, I]``, expert ``e``'s rows ``e * H .. (e + 1) * H``.
        num_experts: ``E``.
        act_fn: the gate's activation (the config's ``hidden_act``).
        activations: how the projections quantize their activations
            ("int16", "int8"; ``linear.ACTIVATION_QUANTIZATIONS``).

    Raises:
        ValueError: stacks whose rows do not split into ``E`` experts of
            matching sizes.
    """

    def __init__(
        self,
        gate: QuantizedWeight,
        up: QuantizedWeight,
        down: QuantizedWeight,
        num_experts: int,
        act_fn: Callable[[torch.Tensor], torch.Tensor],
        activations: str = "int16",
    ) -> None:
        super().__init__()
        e = num_experts
        if gate.shape != up.shape or gate.shape[0] % e or down.shape[0] % e:
            raise ValueError(
                f"expert stacks gate {gate.shape}, up {up.shape}, down {down.shape} "
                f"do not split into {e} experts"
            )
        inter, hidden = gate.shape[0] // e, gate.shape[1]
        if down.shape != (e * hidden, inter):
            raise ValueError(f"down stack {down.shape} is not [{e} * {hidden}, {inter}]")
        self.num_experts = e
        self.hidden_dim = hidden
        self.intermediate_dim = inter
        self.act_fn = act_fn
        self.stacks = (gate, up, down)
        self.gate_up = [
            QuantizedLinear([gate.rows(i * inter, inter), up.rows(i * inter, inter)])
            for i in range(e)
        ]
        self.down = [QuantizedLinear([down.rows(i * hidden, hidden)]) for i in range(e)]
        self.activations = "int16"
        self.set_activations(activations)
        self._kernel: _core.QuantExperts | None = None
        if all(w.data.device.type == "cpu" for w in self.stacks):
            # The stacks stay in the file's rows: the parts without their layout.
            self._kernel = _core.QuantExperts(
                _kernel_part(gate)[:4], _kernel_part(up)[:4], _kernel_part(down)[:4], e
            )
        self._silu = act_fn is F.silu or isinstance(act_fn, (SiLUActivation, nn.SiLU))

    def set_activations(self, activations: str) -> None:
        """Quantize the projections' activations to ``activations`` ("int16",
        "int8"), in the one call and the per-expert loop alike.

        Raises:
            ValueError: another value.
        """
        self.activations = check_activations(activations)
        for linear in [*self.gate_up, *self.down]:
            linear.activations = activations

    @property
    def nbytes(self) -> int:
        """Bytes of the three quantized stacks."""
        return sum(w.nbytes for w in self.stacks)

    def forward(
        self,
        hidden_states: torch.Tensor,
        top_k_index: torch.Tensor,
        top_k_weights: torch.Tensor,
    ) -> torch.Tensor:
        """The routed experts' weighted sum per token: one Rust call on CPU
        for float32 tokens and a SiLU gate, else ``forward_per_expert``
        (the same bits where both run).

        Args:
            hidden_states: ``[T, H]`` (float32 or bfloat16).
            top_k_index: int ``[T, k]``: each token's experts.
            top_k_weights: ``[T, k]``: their routing weights.
        Returns:
            ``[T, H]`` in ``hidden_states``' dtype.
        Raises:
            ValueError: an expert id outside ``0 .. E - 1``, or shapes that
                do not match.
        """
        if (
            self._kernel is None
            or not self._silu
            or hidden_states.device.type != "cpu"
            or hidden_states.dtype != torch.float32
        ):
            return self.forward_per_expert(hidden_states, top_k_index, top_k_weights)
        x = hidden_states.contiguous()
        ids = top_k_index.to(torch.int64).contiguous()
        # Routing weights of a narrower float dtype widen exactly, as the
        # per-expert loop's ``y * weights`` promotes them.
        weights = top_k_weights.to(torch.float32).contiguous()
        out = torch.empty_like(x)
        self._kernel.forward(
            x.numpy(),
            ids.numpy(),
            weights.numpy(),
            out.numpy(),
            torch.get_num_threads(),
            None,
            self.activations,
        )
        return out

    def forward_per_expert(
        self,
        hidden_states: torch.Tensor,
        top_k_index: torch.Tensor,
        top_k_weights: torch.Tensor,
    ) -> torch.Tensor:
        """``forward`` as a loop over the hit experts in ascending id, one
        ``QuantizedLinear`` call for gate/up and one for down per expert,
        ``index_add_`` of the weighted outputs; shapes as ``forward``."""
        out = torch.zeros_like(hidden_states)
        flat = top_k_index.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()
        tokens = order // top_k_index.shape[1]
        weights = top_k_weights.reshape(-1)[order]
        start = 0
        for expert, count in enumerate(counts):
            if count == 0:
                continue
            rows = tokens[start : start + count]
            x = hidden_states[rows]
            gate, up = self.gate_up[expert](x).chunk(2, dim=-1)
            y = self.down[expert](self.act_fn(gate) * up)
            y = y * weights[start : start + count, None]
            out.index_add_(0, rows, y.to(out.dtype))
            start += count
        return out

    def extra_repr(self) -> str:
        return (
            f"experts={self.num_experts}, hidden={self.hidden_dim}, "
            f"intermediate={self.intermediate_dim}, qtype={self.stacks[0].qtype}, "
            f"activations={self.activations}"
        )
