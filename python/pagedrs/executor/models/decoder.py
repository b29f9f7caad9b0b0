"""``PagedDecoderModel``: what every native model shares, on packed steps
with paged attention.

The step's ``T`` tokens of all sequences run as one ``[T, hidden]`` matrix.
Per layer: the input norm, one fused QKV projection, the q/k norms where the
family has them (over all heads at once), rotary embedding by table lookup,
paged attention (``AttentionBackend.forward``, with the layer's
``AttentionOptions``: its scale, sliding window and logit soft cap), the
output projection, one fused gate/up projection, the gate activation times
up, the down projection. A family (``llama``, ``qwen3``, ``gemma``,
``phi3``) says which HF models it runs (``supports``), how a layer is built
(its norms, its rotary table) and, where it differs from the pre-norm
residual of Llama, how a layer runs (``layer_forward``).

Weights are taken from the loaded HF model (``projections``): HF's modules
keep working on the same numbers. Each layer attends with the window
transformers applies to it (``kv_cache.layer_sliding_windows``) through the
metadata of its KV cache group.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, NamedTuple

import torch
from torch import nn
from transformers import PreTrainedModel

from ...attention.backends import AttentionBackend
from ...attention.metadata import AttentionMetadata
from ...attention.options import AttentionOptions
from ..kv_cache import layer_sliding_windows
from ..model_support import DYNAMIC_ROPE_TYPES, rope_types
from .linear import Linear, PackedRows
from .ops import RMSNorm, RotaryTable, gate_activation, norm_of
from .projections import Projection, projection, return_freed_memory, single


class LayerStep(NamedTuple):
    """What one layer of a step attends with besides its hidden rows.

    Attributes:
        rope: the ``(cos, sin)`` rows of the layer's rotary table at the
            step's positions (``RotaryTable.lookup``).
        meta: the step's attention metadata of the layer's KV cache group.
        cache: the layer's ``(key_cache, value_cache)``, ``[N, Hkv, bs, E]``.
        backend: the attention backend.
    """

    rope: tuple[torch.Tensor, torch.Tensor]
    meta: AttentionMetadata
    cache: tuple[torch.Tensor, torch.Tensor]
    backend: AttentionBackend


class DecoderLayer:
    """One decoder layer's projections, norms and attention settings.

    Attributes:
        qkv, o_proj, gate_up, down_proj: the projections (q/k/v and gate/up
            fused; ``Linear`` or ``QuantizedLinear``).
        qkv_weight, gate_up_weight: the fused float matrices HF's
            projections are views of (None when quantized, packed or stored
            fused by the checkpoint).
        qkv_names, gate_up_names: HF's modules whose rows ``qkv`` /
            ``gate_up`` hold, in order.
        act: the gate activation.
        input_norm, post_norm: the norms before attention and before the MLP.
        qk_norm: the q/k norm over the fused q/k heads, or None.
        attention: the layer's ``AttentionOptions``.
        rope: index of its rotary table in the model's ``rotary``.
        group: its KV cache group.
    """

    def __init__(self, hf_layer: Any, batch_invariant: bool, offset: bool) -> None:
        attn = hf_layer.self_attn
        bi = batch_invariant
        qkv = ["qkv_proj"] if hasattr(attn, "qkv_proj") else ["q_proj", "k_proj", "v_proj"]
        self.qkv_names = tuple(qkv)
        self.qkv, self.qkv_weight = projection(attn, qkv, bi)
        self.o_proj: Projection = projection(attn, ["o_proj"], bi)[0]
        self.init_mlp(hf_layer.mlp, bi)
        self.input_norm = norm_of(hf_layer.input_layernorm, offset)
        self.post_norm = norm_of(hf_layer.post_attention_layernorm, offset)
        self.qk_norm: RMSNorm | None = None
        self.attention = AttentionOptions(float(attn.scaling))
        self.rope = 0
        self.group = 0

    def init_mlp(self, mlp: Any, batch_invariant: bool) -> None:
        """The MLP's projections and activation from HF's ``mlp``."""
        gate_up = ["gate_up_proj"] if hasattr(mlp, "gate_up_proj") else ["gate_proj", "up_proj"]
        self.gate_up_names = tuple(gate_up)
        self.gate_up, self.gate_up_weight = projection(mlp, gate_up, batch_invariant)
        self.down_proj: Projection = projection(mlp, ["down_proj"], batch_invariant)[0]
        act = gate_activation(_act_module(mlp))
        assert act is not None  # supports() checked it
        self.act = act

    def projections(self) -> list[Projection]:
        """Every projection of the layer."""
        return [self.qkv, self.o_proj, self.gate_up, self.down_proj]


def _act_module(mlp: Any) -> nn.Module:
    act: nn.Module = getattr(mlp, "act_fn", None) or mlp.activation_fn
    return act


class PagedDecoderModel:
    """The decoder stack of an HF causal LM, run on packed paged steps.

    Args:
        model: HF causal LM (``supports(model)`` must hold); its projection
            weights are re-bound as views of the fused matrices.
        max_positions: rotary table length (tokens), at least ``max_model_len``.
        batch_invariant: every float projection and the LM head
            batch-invariant (``linear.Linear``'s flag).
        layer_groups: the KV cache group of each layer (its metadata in
            ``forward``); None: all in group 0.
        group_windows: each group's sliding window (None: full attention);
            None: no sliding group.
    Raises:
        ValueError: for a model ``supports`` rejects, ``batch_invariant``
            with weights it cannot hold for, or a layer in a sliding-window
            group whose window is not the layer's own.
    """

    #: HF model types the family runs.
    model_types: ClassVar[tuple[str, ...]] = ()
    #: Gemma's ``1 + weight`` norms.
    norm_offset: ClassVar[bool] = False
    #: The class of the family's layers.
    layer_class: ClassVar[type[DecoderLayer]] = DecoderLayer

    @classmethod
    def supports(cls, model: PreTrainedModel) -> bool:
        """Whether this class computes the same function as ``model``."""
        cfg = model.config
        if cfg.model_type not in cls.model_types or rope_types(cfg) & DYNAMIC_ROPE_TYPES:
            return False
        inner = model.get_decoder()
        if not (hasattr(inner, "rotary_emb") and hasattr(inner, "layers")):
            return False
        return all(cls.supports_mlp(layer.mlp) for layer in inner.layers) and cls.supports_config(
            cfg
        )

    @classmethod
    def supports_mlp(cls, mlp: nn.Module) -> bool:
        """Whether the family runs HF's MLP module ``mlp`` (default: a gated
        MLP whose activation ``ops.gate_activation`` computes)."""
        return gate_activation(_act_module(mlp)) is not None

    @classmethod
    def supports_config(cls, config: object) -> bool:
        """The family's own conditions on the config (default: none)."""
        return True

    def __init__(
        self,
        model: PreTrainedModel,
        max_positions: int,
        batch_invariant: bool = False,
        layer_groups: Sequence[int] | None = None,
        group_windows: Sequence[int | None] | None = None,
    ) -> None:
        if not self.supports(model):
            raise ValueError(f"no native implementation for {model.config.model_type!r}")
        cfg = model.config
        inner = model.get_decoder()
        self.config = cfg
        self.hidden_size = int(cfg.hidden_size)
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = getattr(cfg, "num_key_value_heads", None) or self.num_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.num_heads
        self.embed_tokens = inner.embed_tokens
        windows = layer_sliding_windows(cfg)
        groups = list(layer_groups) if layer_groups is not None else [0] * len(windows)
        self.layers = [
            self.make_layer(i, layer, batch_invariant) for i, layer in enumerate(inner.layers)
        ]
        for i, layer in enumerate(self.layers):
            layer.group = groups[i]
            group_window = None if group_windows is None else group_windows[groups[i]]
            if group_window is not None and group_window != windows[i]:
                raise ValueError(
                    f"layer {i} attends with sliding_window={windows[i]}, but its KV cache "
                    f"group {groups[i]} holds a sliding window of {group_window} tokens"
                )
            options = layer.attention
            layer.attention = AttentionOptions(
                options.scale, windows[i], options.softcap, options.sinks
            )
        self.norm = norm_of(inner.norm, self.norm_offset)
        head = model.get_output_embeddings()
        self.lm_head = single(head, batch_invariant)
        packed_head = isinstance(self.lm_head, Linear) and self.lm_head.packed is not None
        if packed_head and head.weight is not getattr(inner.embed_tokens, "weight", None):
            assert isinstance(self.lm_head, Linear)
            model.set_output_embeddings(
                PackedRows(self.lm_head, 0, self.lm_head.out_features, head.bias)
            )
            self.lm_head.release_plain()
        if any(lin.weight is None for lin in self._float_linears()):
            return_freed_memory()
        dtype, device = inner.norm.weight.dtype, inner.norm.weight.device
        self.rotary = [
            RotaryTable(inner.rotary_emb, max_positions, dtype, device, *args)
            for args in self.rotary_args()
        ]

    def make_layer(self, index: int, hf_layer: nn.Module, batch_invariant: bool) -> DecoderLayer:
        """Layer ``index``'s tensors (a family adds its norms, scale, cap)."""
        return self.layer_class(hf_layer, batch_invariant, self.norm_offset)

    def rotary_args(self) -> list[tuple[str, ...]]:
        """The rotary tables to build: each one's arguments to HF's rotary
        module after ``(x, position_ids)`` (layers pick one by ``rope``)."""
        return [()]

    def _float_linears(self) -> list[Linear]:
        linears = [self.lm_head]
        for layer in self.layers:
            linears += layer.projections()
        return [m for m in linears if isinstance(m, Linear)]

    def packed_weights(self) -> list[torch.Tensor]:
        """The oneDNN-packed weights the projections hold outside the HF
        model (``Linear.packed``; empty when nothing is packed)."""
        return [m.packed for m in self._float_linears() if m.packed is not None]

    def attend(self, layer: DecoderLayer, h: torch.Tensor, step: LayerStep) -> torch.Tensor:
        """``[T, Hq * D]`` attention output of the normed hidden rows ``h``
        (before the output projection)."""
        t = h.shape[0]
        hq, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        qkv = layer.qkv(h)
        qk = qkv[:, : (hq + hkv) * d].view(t, hq + hkv, d)
        if layer.qk_norm is not None:
            qk = layer.qk_norm(qk)
        qk = self.rotary[layer.rope].rotate(qk, *step.rope)
        v = qkv[:, (hq + hkv) * d :].view(t, hkv, d)
        key_cache, value_cache = step.cache
        out = step.backend.forward(
            qk[:, :hq], qk[:, hq:], v, key_cache, value_cache, step.meta, layer.attention
        )
        return out.reshape(t, hq * d)

    def layer_forward(self, layer: DecoderLayer, x: torch.Tensor, step: LayerStep) -> torch.Tensor:
        """One pre-norm layer (Llama's residuals): ``x + o(attn(norm(x)))``,
        then ``+ down(act(gate) * up)`` of the post-attention norm."""
        attn = self.attend(layer, layer.input_norm(x), step)
        x = layer.o_proj.add_to(x, attn)
        gate, up = layer.gate_up(layer.post_norm(x)).chunk(2, dim=-1)
        return layer.down_proj.add_to(x, layer.act(gate).mul_(up))

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata | Sequence[AttentionMetadata],
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        backend: AttentionBackend,
    ) -> torch.Tensor:
        """Hidden states of a packed step, before the final norm.

        Args:
            input_ids: int64 ``[T]``.
            positions: int64 ``[T]`` (position of each token in its sequence).
            meta: the step's attention metadata of each KV cache group (one:
                every layer's).
            kv_caches: per layer ``(key_cache, value_cache)``, ``[N, Hkv, bs, E]``.
            backend: the attention backend.
        Returns:
            ``[T, hidden]`` in the model dtype.
        """
        metas = [meta] if isinstance(meta, AttentionMetadata) else list(meta)
        ropes = [table.lookup(positions) for table in self.rotary]
        x = self.embed_tokens(input_ids)
        for layer, cache in zip(self.layers, kv_caches, strict=True):
            m = metas[layer.group if len(metas) > 1 else 0]
            x = self.layer_forward(layer, x, LayerStep(ropes[layer.rope], m, cache, backend))
        return x

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[R, vocab]`` logits of hidden rows ``[R, hidden]`` (final norm + LM
        head), in the model dtype (the sampler upcasts what it needs; a final
        soft cap is the runner's ``logits_transform``)."""
        return self.lm_head(self.norm(hidden))
