"""Load a GGUF file with its projection weights kept quantized.

The file (or each part of a split file: ``gguf_split.read_gguf``) is read
through a memory map (``gguf_header.read_header``: one pass over the header,
the tensors' bytes views of the map); each quantized
projection becomes a ``QuantizedWeight`` over a view of its tensor's bytes
(uint8 ``[N, row_bytes]``, ggml's row-major blocks), so no float copy of the
model is built. The architecture (``gguf_archs.GGUF_ARCHS``; any other is
refused by name) gives the HF config and the tensors' fix-ups. The model's
skeleton is HF's own class for the config, made with its parameters on the
meta device; GGUF tensor names map to HF's with gguf-py's table of the
architecture (``get_tensor_name_map``). Then:

- a quantized tensor of an ``nn.Linear`` becomes a ``QuantizedLinearModule``
  (Phi-3's fused ``attn_qkv`` and gate/up ``ffn_up`` run fused, as HF's
  ``qkv_proj`` / ``gate_up_proj``, their outputs split by HF's forward);
  where llama.cpp's converter interleaved the rotary halves of ``attn_q`` /
  ``attn_k`` (Llama, Granite), undoing it is a row gather (whole rows, once);
- a quantized ``token_embd`` becomes a ``QuantizedEmbedding`` and, without an
  ``output`` tensor (tied embeddings), the LM head is a
  ``QuantizedLinearModule`` over the same ``QuantizedWeight``;
- an MoE layer's expert stacks ``ffn_{gate,up,down}_exps`` become one
  ``QuantizedExperts`` (``experts.py``) in place of HF's experts module;
- ``rope_freqs`` (Llama 3's frequency divisors) divides the rotary tables'
  inverse frequencies, as llama.cpp divides ``theta``;
- float tensors (F32 / F16 / BF16: norms, biases, the MoE router, a float
  projection) are copied to parameters in the model dtype (Gemma's norms,
  stored as ``1 + w``, less 1).

Every tensor is checked before anything is built: a type outside
``QUANT_TYPES`` and F32/F16/BF16 (IQ*, TQ*, MXFP4, Q2_K, Q3_K...), a tensor
that runs past the end of its file (or any refusal of ``gguf_header``), and a
shape other than the config's each raise ``GGUFLoadError`` naming the file,
the tensor and its type.

The config comes from the file's metadata (``gguf_archs.read_config``), the
tokenizer from ``gguf_tokenizer`` (both cached, ``gguf_cache``).
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from transformers import AutoModelForCausalLM, PreTrainedModel

from .experts import QuantizedExperts
from .gguf_archs import GGUFArch, GGUFLoadError, gguf_arch, qk_row_order
from .gguf_header import GGML_F16, GGML_F32, GGUFHeaderError, GGUFTensorInfo
from .gguf_split import GGUFModelFile, read_gguf
from .modules import QuantizedEmbedding, QuantizedLinearModule
from .weight import GGUF_BLOCK_TYPES, QuantizedWeight

logger = logging.getLogger(__name__)

#: Float GGUF types read as float parameters (in the model dtype).
FLOAT_TYPES: tuple[str, ...] = ("F32", "F16", "BF16")


def _open(path: Path) -> GGUFModelFile:
    try:
        return read_gguf(path)
    except GGUFHeaderError as e:
        raise GGUFLoadError(str(e)) from e
    except OSError as e:
        raise GGUFLoadError(f"{path}: cannot read the GGUF file ({e})") from e


def check_tensors(path: Path, header: GGUFModelFile) -> None:
    """Refuse the file unless every tensor has a type pagedrs keeps
    (``GGUF_BLOCK_TYPES``) or reads as float (``FLOAT_TYPES``); the header
    reader already refused tensors that do not lie wholly inside their file.

    Raises:
        GGUFLoadError: naming the file, the first such tensor and its type.
    """
    for t in header.tensors:
        qtype = t.type_name
        if qtype not in GGUF_BLOCK_TYPES and qtype not in FLOAT_TYPES:
            kept = ", ".join((*GGUF_BLOCK_TYPES, *FLOAT_TYPES))
            raise GGUFLoadError(
                f"{path}: tensor {t.name!r} has type {qtype}, which pagedrs does not run "
                f"(supported: {kept})"
            )


def _tensor_view(array: np.ndarray) -> torch.Tensor:
    """A torch view of a read-only memory-mapped array (never written)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "not writable": we only read
        return torch.from_numpy(array)


def _set_module(model: nn.Module, path: str, module: nn.Module) -> None:
    parent_name, _, child = path.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, module)


def _skeleton(config: Any, dtype: torch.dtype) -> PreTrainedModel:
    """HF's model for ``config`` with parameters on the meta device (no
    memory) and buffers (rotary tables, embedding scales) real, as the
    modules' constructors make them. Weight initialization is skipped
    (transformers' ``no_init_weights``): every parameter is replaced by the
    file's tensor, and the initializers would only redo on meta tensors what
    the constructors did for the buffers. Embeddings are left untied."""
    from accelerate import init_empty_weights
    from transformers.initialization import no_init_weights

    from ...attention.hf_attention import ATTN_IMPLEMENTATION, register

    register()
    with init_empty_weights(include_buffers=False), no_init_weights():
        model = AutoModelForCausalLM.from_config(
            config, dtype=dtype, attn_implementation=ATTN_IMPLEMENTATION
        )
    return model


def _name_map(model: PreTrainedModel, arch: str, path: Path) -> dict[str, str]:
    """GGUF tensor name -> HF parameter name, from gguf-py's table of the
    architecture (``get_tensor_name_map``, the table transformers uses); kept
    in the file's metadata cache entry (``gguf_cache.cached_json``: the
    header fixes the config and so the skeleton's names) per gguf-py and
    transformers version, so a later load imports no gguf-py."""
    from importlib.metadata import version

    from ..gguf_cache import cached_json

    names = [n for n, _ in model.named_parameters(remove_duplicate=False)]
    key = f"tensor-name-map-gguf{version('gguf')}-transformers{version('transformers')}"
    return dict(cached_json(path, key, lambda: _build_name_map(names, arch, model.config)))


def _build_name_map(names: list[str], arch: str, config: Any) -> dict[str, str]:
    import gguf

    archs = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}
    if arch not in archs:
        raise GGUFLoadError(f"GGUF architecture {arch!r} is unknown to gguf-py")
    table = gguf.get_tensor_name_map(archs[arch], config.num_hidden_layers)
    out: dict[str, str] = {}
    for hf_name in names:
        base, _, suffix = hf_name.rpartition(".")
        gguf_name = table.get_name(base)
        if gguf_name is None and base.startswith("model."):
            gguf_name = table.get_name(base[len("model.") :])
        if gguf_name is not None:
            out.setdefault(f"{gguf_name}.{suffix}", hf_name)
    return out


def _row_order(spec: GGUFArch, config: Any, name: str, rows: int) -> torch.Tensor | None:
    """The HF row order of tensor ``name`` (``qk_row_order`` for an
    interleaved ``attn_q`` / ``attn_k``), or None when rows are in place."""
    if not spec.qk_permuted:
        return None
    kind = name.split(".")[2] if name.startswith("blk.") else ""
    heads = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}
    if kind not in heads:
        return None
    return torch.from_numpy(qk_row_order(rows, heads[kind]))


def _float_values(
    header: GGUFModelFile, t: GGUFTensorInfo, spec: GGUFArch, config: Any
) -> np.ndarray:
    """A float tensor's values in HF's layout: rows reordered, Gemma's norm
    offset removed."""
    if t.ggml_type in (GGML_F32, GGML_F16):  # ``data`` gives their values
        values = np.asarray(header.data(t), dtype=np.float32)
    else:
        import gguf

        values = gguf.quants.dequantize(header.data(t), gguf.GGMLQuantizationType(t.ggml_type))
        values = np.asarray(values, dtype=np.float32)
    if spec.norm_offset and t.name.endswith("norm.weight"):
        values = values - spec.norm_offset
    order = _row_order(spec, config, t.name, values.shape[0])
    return values if order is None else values[order.numpy()]


def _quantized(
    where: str, header: GGUFModelFile, t: GGUFTensorInfo, shape: list[int]
) -> QuantizedWeight:
    """The tensor's bytes as a ``[rows, K]`` weight, ``shape`` its HF shape
    (2-D, or 3-D for an expert stack, viewed as ``[E * rows, K]``)."""
    dims = list(reversed(t.dims))  # GGUF lists the row length first
    if dims != shape:
        raise GGUFLoadError(f"{where}: shape {dims} does not match the config's {shape}")
    data = _tensor_view(header.data(t))
    data = data.reshape(-1, data.shape[-1])
    try:
        return QuantizedWeight(t.type_name, (data.shape[0], dims[-1]), data)
    except ValueError as e:
        raise GGUFLoadError(f"{where}: {e}") from e


def _load_experts(
    path: Path, header: GGUFModelFile, model: PreTrainedModel, config: Any
) -> set[str]:
    """Each MoE layer's ``mlp.experts`` replaced by ``QuantizedExperts`` over
    its ``ffn_{gate,up,down}_exps`` stacks; the tensor names used."""
    by_name = {t.name: t for t in header.tensors}
    e, inter, hidden = config.num_experts, config.moe_intermediate_size, config.hidden_size
    used: set[str] = set()
    for i in range(config.num_hidden_layers):
        stacks = []
        for kind, shape in (
            ("gate", [e, inter, hidden]),
            ("up", [e, inter, hidden]),
            ("down", [e, hidden, inter]),
        ):
            name = f"blk.{i}.ffn_{kind}_exps.weight"
            t = by_name.get(name)
            if t is None:
                raise GGUFLoadError(f"{path}: no tensor {name!r} (layer {i}'s expert stack)")
            where = f"{path}: tensor {name!r} ({t.type_name})"
            if t.type_name not in GGUF_BLOCK_TYPES:
                raise GGUFLoadError(
                    f"{where}: pagedrs runs expert stacks in GGUF block types only "
                    f"({', '.join(GGUF_BLOCK_TYPES)})"
                )
            stacks.append(_quantized(where, header, t, shape))
            used.add(name)
        module_name = f"model.layers.{i}.mlp.experts"
        act = model.get_submodule(module_name).act_fn
        assert callable(act)
        gate, up, down = stacks
        _set_module(model, module_name, QuantizedExperts(gate, up, down, e, act))
    return used


def _apply_rope_freqs(header: GGUFModelFile, model: PreTrainedModel) -> set[str]:
    """llama.cpp's ``rope_freqs`` (Llama 3's per-frequency divisors): each
    rotary table's inverse frequencies divided by them, as llama.cpp's RoPE
    divides ``theta``."""
    t = next((t for t in header.tensors if t.name == "rope_freqs.weight"), None)
    if t is None:
        return set()
    import gguf

    freqs = torch.from_numpy(
        np.asarray(
            gguf.quants.dequantize(header.data(t), gguf.GGMLQuantizationType(t.ggml_type)),
            dtype=np.float32,
        ).reshape(-1)
    )
    for module in model.modules():
        inv = getattr(module, "inv_freq", None)
        if isinstance(inv, torch.Tensor):
            if inv.shape != freqs.shape:
                raise GGUFLoadError(
                    f"{header.path}: rope_freqs has {freqs.numel()} values, the rotary table "
                    f"{inv.numel()}"
                )
            module.inv_freq = inv / freqs.to(inv.dtype)
            if isinstance(getattr(module, "original_inv_freq", None), torch.Tensor):
                module.original_inv_freq = module.inv_freq.clone()
    return {t.name}


def load_gguf_quantized(path: Path, config: Any, dtype: torch.dtype) -> PreTrainedModel:
    """The causal LM of GGUF file ``path`` on CPU, its quantized projections
    and embeddings kept in their blocks (module docs).

    Args:
        path: the ``.gguf`` file.
        config: its HF config (``gguf_archs.gguf_config``).
        dtype: the activations' and float parameters' dtype (float32 or
            bfloat16).
    Returns:
        The HF model in eval mode, attention routed to pagedrs.
    Raises:
        GGUFLoadError: an unreadable or truncated file, an architecture
            outside ``GGUF_ARCHS``, a tensor type pagedrs does not run, a
            tensor whose shape differs from the config's, a quantized tensor
            of a module other than a linear layer or an embedding, or a
            parameter the file does not hold. Nothing stays loaded.
    """
    header = _open(path)
    check_tensors(path, header)
    spec = gguf_arch(header)
    arch = str(header.metadata.get("general.architecture"))
    model = _skeleton(config, dtype)
    used = _load_experts(path, header, model, config) if spec.experts else set()
    used |= _apply_rope_freqs(header, model)
    name_map = _name_map(model, arch, path)
    modules = dict(model.named_modules())
    biases: dict[str, torch.Tensor] = {}
    embedding: QuantizedWeight | None = None
    for t in header.tensors:
        hf_name = name_map.get(t.name)
        qtype = t.type_name
        if t.name in used:
            continue
        if hf_name is None:
            logger.info("%s: tensor %r (%s) is not used by %s", path, t.name, qtype, arch)
            continue
        module_name, _, attr = hf_name.rpartition(".")
        module = modules[module_name]
        param = getattr(module, attr)
        where = f"{path}: tensor {t.name!r} ({qtype}) for {hf_name}"
        if qtype in GGUF_BLOCK_TYPES:
            weight = _quantized(where, header, t, list(param.shape))
            order = _row_order(spec, config, t.name, weight.shape[0])
            if order is not None:  # whole rows, gathered once (a copy per row)
                rows = np.take(weight.data.numpy(), order.numpy(), axis=0)
                weight = QuantizedWeight(qtype, weight.shape, torch.from_numpy(rows))
            if type(module) is nn.Linear and attr == "weight":
                _set_module(model, module_name, QuantizedLinearModule(weight))
            elif isinstance(module, nn.Embedding) and attr == "weight":
                scale = getattr(module, "embed_scale", None)
                if type(module) is not nn.Embedding and scale is None:
                    raise GGUFLoadError(f"{where}: {type(module).__name__} cannot run quantized")
                _set_module(model, module_name, QuantizedEmbedding(weight, dtype, scale))
                embedding = weight
            else:
                raise GGUFLoadError(
                    f"{where}: a quantized tensor of a {type(module).__name__}, which "
                    "pagedrs runs quantized only as a linear layer or an embedding"
                )
            continue
        values = _float_values(header, t, spec, config)
        if tuple(values.shape) != tuple(param.shape):
            raise GGUFLoadError(
                f"{where}: shape {list(values.shape)} does not match the config's "
                f"{list(param.shape)}"
            )
        tensor = torch.tensor(values, dtype=dtype)
        if attr == "bias" and isinstance(module, nn.Linear):
            biases[module_name] = tensor
        setattr(module, attr, nn.Parameter(tensor, requires_grad=False))
    for module_name, bias in biases.items():
        module = model.get_submodule(module_name)
        if isinstance(module, QuantizedLinearModule):
            module.set_bias(bias)
    head = model.get_output_embeddings()
    if isinstance(head, nn.Linear) and head.weight.is_meta and embedding is not None:
        # Tied embeddings: the LM head reads the embedding's quantized weight.
        model.set_output_embeddings(QuantizedLinearModule(embedding))
    elif isinstance(head, nn.Linear) and head.weight.is_meta:
        inner = model.get_input_embeddings()
        if isinstance(inner, nn.Embedding) and not inner.weight.is_meta:
            head.weight = inner.weight
    missing = [n for n, p in model.named_parameters() if p.is_meta]
    if missing:
        raise GGUFLoadError(f"{path}: no tensor for {len(missing)} parameters: {missing[:4]}")
    return model.eval()
