"""Llama-family decoder (Llama, Mistral without sliding window, Qwen2) on packed
steps with paged attention.

The step's ``T`` tokens of all sequences run as one ``[T, hidden]`` matrix: per
layer one fused QKV matmul, rotary embedding by table lookup, paged attention
(``AttentionBackend.forward``), the output projection, one fused
gate/up matmul, SiLU-and-multiply and the down projection. Weights are taken
from the loaded HF model; the fused matrices are built once and HF's own
projection weights become views of them, so HF's modules (the reference in
tests) keep working on the same numbers. bfloat16 projections on CPU are
packed for oneDNN instead (``linear``): the packed weight replaces the plain
one, and HF's modules become ``PackedRows`` over it (an LM head tied to the
embeddings keeps its plain weight too).
"""

from __future__ import annotations

import ctypes
import ctypes.util

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel

from ...attention.backends import AttentionBackend
from ...attention.metadata import AttentionMetadata
from ...attention.options import AttentionOptions
from ..quant.linear import QuantizedLinear
from ..quant.modules import QuantizedLinearModule
from .linear import Linear, PackedRows

_FAMILIES = ("llama", "mistral", "qwen2")


def supports_native(model: PreTrainedModel) -> bool:
    """Whether ``PagedLlamaModel`` computes the same function as this HF model."""
    cfg = model.config
    if cfg.model_type not in _FAMILIES or getattr(cfg, "hidden_act", "silu") != "silu":
        return False
    if cfg.model_type == "mistral" and getattr(cfg, "sliding_window", None):
        return False
    if cfg.model_type == "qwen2" and getattr(cfg, "use_sliding_window", False):
        return False
    inner = model.get_decoder()
    return hasattr(inner, "rotary_emb") and hasattr(inner, "layers")


def _fuse(linears: list[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Stack the rows of ``linears`` into one weight (and bias); rebind each
    module's parameters as views of the fused tensors."""
    weight = torch.cat([m.weight.detach() for m in linears]).contiguous()
    has_bias = [m.bias is not None for m in linears]
    bias = None
    if any(has_bias):
        bias = torch.cat(
            [
                m.bias.detach() if m.bias is not None else weight.new_zeros(m.out_features)
                for m in linears
            ]
        )
    row = 0
    for m in linears:
        n = m.out_features
        m.weight = nn.Parameter(weight[row : row + n], requires_grad=False)
        if bias is not None and m.bias is not None:
            m.bias = nn.Parameter(bias[row : row + n], requires_grad=False)
        row += n
    return weight, bias


def _tensor(module: nn.Module, name: str) -> torch.Tensor:
    """``module``'s tensor attribute ``name`` (a parameter, buffer or property).

    Raises:
        TypeError: the attribute is not a tensor.
    """
    value = getattr(module, name)
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{type(module).__name__}.{name} is {type(value).__name__}, not a tensor")
    return value


def _number(module: nn.Module, name: str) -> float:
    """``module``'s numeric attribute ``name`` (e.g. an RMSNorm's epsilon).

    Raises:
        TypeError: the attribute is not a number.
    """
    value = getattr(module, name)
    if not isinstance(value, (int, float)):
        raise TypeError(f"{type(module).__name__}.{name} is {type(value).__name__}, not a number")
    return float(value)


def _fused(modules: list[nn.Module], batch_invariant: bool = False) -> Linear | QuantizedLinear:
    """One projection over ``modules``' output rows: a ``QuantizedLinear``
    over their quantized weight parts (formats may differ), or a ``Linear``
    over fused float weights (``_fuse``), batch-invariant with
    ``batch_invariant`` (quantized ones always are).

    Raises:
        ValueError: quantized and float projections mixed, or a module that
            is neither (not an ``nn.Linear``).
    """
    quantized = [m for m in modules if isinstance(m, QuantizedLinearModule)]
    if len(quantized) == len(modules):
        parts = [m.qweight for m in quantized]
        bias = None
        if any(m.bias is not None for m in quantized):
            bias = torch.cat(
                [
                    m.bias.detach() if m.bias is not None else torch.zeros(m.out_features)
                    for m in quantized
                ]
            )
        activations = {m.activations for m in quantized}
        if len(activations) != 1:
            raise ValueError(f"a fused projection of parts with activations {sorted(activations)}")
        return QuantizedLinear(parts, bias, activations=activations.pop())
    if quantized:
        raise ValueError("a fused projection of quantized and float parts")
    linears = [m for m in modules if isinstance(m, nn.Linear)]
    if len(linears) != len(modules):
        kinds = sorted({type(m).__name__ for m in modules})
        raise ValueError(f"a fused projection of {kinds}: expected nn.Linear parts")
    weight, bias = _fuse(linears)
    return Linear(weight, bias, batch_invariant=batch_invariant)


def _single(module: nn.Module, batch_invariant: bool = False) -> Linear | QuantizedLinear:
    if isinstance(module, QuantizedLinearModule):
        return module.linear
    bias = getattr(module, "bias", None)
    return Linear(_tensor(module, "weight"), bias, batch_invariant=batch_invariant)


def _replace_plain(parent: nn.Module, names: list[str], linear: Linear | QuantizedLinear) -> bool:
    """If ``linear`` is packed: put a ``PackedRows`` over its rows in the
    place of each of ``parent``'s modules ``names`` (in the order their rows
    were fused) and drop its plain weight. Returns whether it did."""
    if not isinstance(linear, Linear) or linear.packed is None:
        return False
    row = 0
    for name in names:
        module = getattr(parent, name)
        n = module.out_features
        setattr(parent, name, PackedRows(linear, row, row + n, getattr(module, "bias", None)))
        row += n
    linear.release_plain()
    return True


class _Layer:
    """One decoder layer's tensors."""

    def __init__(self, hf_layer: nn.Module, batch_invariant: bool = False) -> None:
        attn, mlp = hf_layer.get_submodule("self_attn"), hf_layer.get_submodule("mlp")
        bi = batch_invariant
        self.qkv = _fused([attn.get_submodule(n) for n in ("q_proj", "k_proj", "v_proj")], bi)
        self.o_proj = _single(attn.get_submodule("o_proj"), bi)
        self.gate_up = _fused([mlp.get_submodule(n) for n in ("gate_proj", "up_proj")], bi)
        self.down_proj = _single(mlp.get_submodule("down_proj"), bi)
        # The fused float matrices (HF's projections are views of them).
        self.qkv_weight = self.qkv.weight if isinstance(self.qkv, Linear) else None
        self.gate_up_weight = self.gate_up.weight if isinstance(self.gate_up, Linear) else None
        # Packed projections: HF's modules become views of the packed weights.
        if _replace_plain(attn, ["q_proj", "k_proj", "v_proj"], self.qkv):
            self.qkv_weight = None
        _replace_plain(attn, ["o_proj"], self.o_proj)
        if _replace_plain(mlp, ["gate_proj", "up_proj"], self.gate_up):
            self.gate_up_weight = None
        _replace_plain(mlp, ["down_proj"], self.down_proj)
        input_layernorm = hf_layer.get_submodule("input_layernorm")
        self.input_norm = _tensor(input_layernorm, "weight")
        self.post_norm = _tensor(hf_layer.get_submodule("post_attention_layernorm"), "weight")
        self.eps = _number(input_layernorm, "variance_epsilon")
        self.scale = _number(attn, "scaling")
        self.attention = AttentionOptions(self.scale)


def _return_freed_memory() -> None:
    """Hand the heap's free pages back to the OS (glibc's ``malloc_trim``):
    the plain weights freed after packing sit in the heap otherwise, out of
    the process's use until later allocations reuse them. A no-op without
    glibc."""
    name = ctypes.util.find_library("c")
    if name is None:
        return
    trim = getattr(ctypes.CDLL(name), "malloc_trim", None)
    if trim is not None:
        trim(0)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm as HF Llama computes it (statistics in float32):
    ``weight * (h * rsqrt(mean(h^2) + eps)).to(x.dtype)`` with ``h = x.float()``.

    torch's fused ``F.rms_norm`` computes the float32 part with the same bits
    as HF's formula in fewer passes over memory (``tests/models``); for
    float32 weights and input it takes the weight too."""
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    return weight * F.rms_norm(x.float(), (x.shape[-1],), None, eps).to(x.dtype)


class PagedLlamaModel:
    """The decoder stack of an HF Llama-family model, run on packed paged steps.

    Args:
        model: HF causal LM (``supports_native(model)`` must hold); its
            projection weights are re-bound as views of the fused matrices.
        max_positions: rotary table length (tokens), at least ``max_model_len``.
        batch_invariant: every float projection and the LM head
            batch-invariant (``linear.Linear``'s flag).
    Raises:
        ValueError: for a model ``supports_native`` rejects, or
            ``batch_invariant`` with weights it cannot hold for.
    """

    def __init__(
        self, model: PreTrainedModel, max_positions: int, batch_invariant: bool = False
    ) -> None:
        if not supports_native(model):
            raise ValueError(f"no native implementation for {model.config.model_type!r}")
        cfg = model.config
        inner = model.get_decoder()
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = getattr(cfg, "num_key_value_heads", None) or self.num_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.num_heads
        self.embed_tokens = inner.embed_tokens
        self.layers = [_Layer(layer, batch_invariant) for layer in inner.layers]
        self.norm = inner.norm.weight
        self.norm_eps = float(inner.norm.variance_epsilon)
        head = model.get_output_embeddings()
        self.lm_head = _single(head, batch_invariant)
        packed_head = isinstance(self.lm_head, Linear) and self.lm_head.packed is not None
        if packed_head and head.weight is not getattr(inner.embed_tokens, "weight", None):
            assert isinstance(self.lm_head, Linear)
            model.set_output_embeddings(
                PackedRows(self.lm_head, 0, self.lm_head.out_features, head.bias)
            )
            self.lm_head.release_plain()
        if any(lin.weight is None for lin in self._float_linears()):
            _return_freed_memory()
        self.cos, self.sin = self._rotary_tables(inner.rotary_emb, max_positions)

    def _float_linears(self) -> list[Linear]:
        linears = [self.lm_head]
        for layer in self.layers:
            linears += [layer.qkv, layer.o_proj, layer.gate_up, layer.down_proj]
        return [m for m in linears if isinstance(m, Linear)]

    def packed_weights(self) -> list[torch.Tensor]:
        """The oneDNN-packed weights the projections hold outside the HF
        model (``Linear.packed``; empty when nothing is packed)."""
        return [m.packed for m in self._float_linears() if m.packed is not None]

    def _rotary_tables(
        self, rotary: nn.Module, max_positions: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``cos``/``sin`` ``[max_positions, D]`` from HF's rotary module (so every
        rope type it supports, with its attention scaling, is honoured)."""
        device = self.norm.device
        positions = torch.arange(max_positions, device=device)[None]
        probe = torch.zeros(1, dtype=self.norm.dtype, device=device)
        with torch.no_grad():
            cos, sin = rotary(probe, positions)
        return cos[0].contiguous(), sin[0].contiguous()

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """HF's ``x * cos + rotate_half(x) * sin`` on ``[T, H, D]``."""
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        backend: AttentionBackend,
    ) -> torch.Tensor:
        """Hidden states of a packed step, before the final norm.

        Args:
            input_ids: int64 ``[T]``.
            positions: int64 ``[T]`` (position of each token in its sequence).
            meta: the step's attention metadata.
            kv_caches: per layer ``(key_cache, value_cache)``, ``[N, Hkv, bs, E]``.
            backend: the attention backend.
        Returns:
            ``[T, hidden]`` in the model dtype.
        """
        t = input_ids.shape[0]
        hq, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        cos = self.cos[positions][:, None]  # [T, 1, D]
        sin = self.sin[positions][:, None]
        x = self.embed_tokens(input_ids)
        for layer, (key_cache, value_cache) in zip(self.layers, kv_caches, strict=True):
            h = _rms_norm(x, layer.input_norm, layer.eps)
            qkv = layer.qkv(h)
            qk = self._rotate(qkv[:, : (hq + hkv) * d].view(t, hq + hkv, d), cos, sin)
            q, k = qk[:, :hq], qk[:, hq:]
            v = qkv[:, (hq + hkv) * d :].view(t, hkv, d)
            attn = backend.forward(q, k, v, key_cache, value_cache, meta, layer.attention)
            x = layer.o_proj.add_to(x, attn.reshape(t, hq * d))
            h = _rms_norm(x, layer.post_norm, layer.eps)
            gate_up = layer.gate_up(h)
            gate, up = gate_up.chunk(2, dim=-1)
            x = layer.down_proj.add_to(x, F.silu(gate).mul_(up))
        return x

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[R, vocab]`` logits of hidden rows ``[R, hidden]`` (final norm + LM
        head), in the model dtype (the sampler upcasts what it needs)."""
        return self.lm_head(_rms_norm(hidden, self.norm, self.norm_eps))
