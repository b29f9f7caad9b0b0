"""Load a GGUF file with its projection weights kept quantized.

The file (or each part of a split file: ``gguf_split.read_gguf``) is read
through a memory map (``gguf_header.read_header``: one pass over the header,
the tensors' bytes views of the map); each quantized
projection becomes a ``QuantizedWeight`` over a view of its tensor's bytes
(uint8 ``[N, row_bytes]``, ggml's row-major blocks), so no float copy of the
model is built. The model's skeleton is HF's own class for the config, made
with its parameters on the meta device; GGUF tensor names map to HF's with
transformers' table (``get_gguf_hf_weights_map``, gguf-py's
``get_tensor_name_map``). Then:

- a quantized tensor of an ``nn.Linear`` becomes a ``QuantizedLinearModule``;
  llama.cpp's converter permutes the rows of Llama's ``attn_q`` / ``attn_k``
  (rotary pairs interleaved); on quantized data undoing it is a row reorder
  (the rows are gathered once, in their blocks);
- a quantized ``token_embd`` becomes a ``QuantizedEmbedding`` and, without an
  ``output`` tensor (tied embeddings), the LM head is a
  ``QuantizedLinearModule`` over the same ``QuantizedWeight``;
- float tensors (F32 / F16 / BF16: norms, biases, a float projection) are
  copied to parameters in the model dtype, after transformers' per-architecture
  fix-ups (Gemma's norms are stored as ``1 + w``).

Every tensor is checked before anything is built: a type outside
``QUANT_TYPES`` and F32/F16/BF16 (IQ*, TQ*, MXFP4, Q2_K, Q3_K...), a tensor
that runs past the end of its file (or any refusal of ``gguf_header``), and a
shape other than the config's each raise ``GGUFLoadError`` naming the file,
the tensor and its type.

The config and tokenizer are read from the GGUF by transformers, as for every
other model.
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

from .gguf_header import GGUFHeader, GGUFHeaderError
from .gguf_split import GGUFModelFile, read_gguf
from .modules import QuantizedEmbedding, QuantizedLinearModule
from .weight import GGUF_BLOCK_TYPES, QuantizedWeight

logger = logging.getLogger(__name__)

#: Float GGUF types read as float parameters (in the model dtype).
FLOAT_TYPES: tuple[str, ...] = ("F32", "F16", "BF16")


class GGUFLoadError(ValueError):
    """A GGUF file pagedrs cannot load quantized; the message names the
    file, the tensor and its type."""


def _open(path: Path) -> GGUFModelFile:
    try:
        return read_gguf(path)
    except GGUFHeaderError as e:
        raise GGUFLoadError(str(e)) from e
    except OSError as e:
        raise GGUFLoadError(f"{path}: cannot read the GGUF file ({e})") from e


def check_tensors(path: Path, header: GGUFModelFile | GGUFHeader) -> None:
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


def _processor(arch: str, config: Any) -> Any:
    """transformers' tensor fix-ups for the GGUF architecture ``arch``, if
    they are ones that work tensor by tensor (others reshape or split
    tensors, which pagedrs does not do on quantized data)."""
    from transformers.modeling_gguf_pytorch_utils import (
        TENSOR_PROCESSORS,
        Gemma2TensorProcessor,
        LlamaTensorProcessor,
        TensorProcessor,
    )

    cls = TENSOR_PROCESSORS.get(arch, TensorProcessor)
    if cls not in (TensorProcessor, LlamaTensorProcessor, Gemma2TensorProcessor):
        raise GGUFLoadError(
            f"GGUF architecture {arch!r}: its tensors are reshaped on load ({cls.__name__}), "
            "which pagedrs does not do on quantized data"
        )
    return cls(config=config.to_dict())


def _row_order(processor: Any, name: str, rows: int) -> torch.Tensor | None:
    """The row permutation the architecture's fix-up applies to tensor
    ``name`` of ``rows`` rows (Llama's q/k), or None when it keeps rows in
    place; found by running the fix-up on the row numbers."""
    index = np.arange(rows, dtype=np.float64).reshape(rows, 1)
    out = np.asarray(processor.process(weights=index, name=name).weights)
    if out.shape != (rows, 1) or not np.array_equal(np.sort(out[:, 0]), index[:, 0]):
        raise GGUFLoadError(f"tensor {name!r}: its fix-up is not a row reorder")
    order = out[:, 0].astype(np.int64)
    if np.array_equal(order, index[:, 0]):
        return None
    return torch.from_numpy(order)


def _set_module(model: nn.Module, path: str, module: nn.Module) -> None:
    parent_name, _, child = path.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, module)


def _skeleton(config: Any, dtype: torch.dtype) -> PreTrainedModel:
    """HF's model for ``config`` with parameters on the meta device (no
    memory) and buffers (rotary tables, embedding scales) real."""
    from accelerate import init_empty_weights

    from ...attention.hf_attention import ATTN_IMPLEMENTATION, register

    register()
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(
            config, dtype=dtype, attn_implementation=ATTN_IMPLEMENTATION
        )
    return model


def _name_map(model: PreTrainedModel, arch: str) -> dict[str, str]:
    """GGUF tensor name -> HF parameter name, from gguf-py's table of the
    architecture (``get_tensor_name_map``, the table transformers uses)."""
    import gguf

    archs = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}
    if arch not in archs:
        raise GGUFLoadError(f"GGUF architecture {arch!r} is unknown to gguf-py")
    table = gguf.get_tensor_name_map(archs[arch], model.config.num_hidden_layers)
    out: dict[str, str] = {}
    for hf_name, _ in model.named_parameters(remove_duplicate=False):
        base, _, suffix = hf_name.rpartition(".")
        gguf_name = table.get_name(base)
        if gguf_name is None and base.startswith("model."):
            gguf_name = table.get_name(base[len("model.") :])
        if gguf_name is not None:
            out.setdefault(f"{gguf_name}.{suffix}", hf_name)
    return out


def load_gguf_quantized(path: Path, config: Any, dtype: torch.dtype) -> PreTrainedModel:
    """The causal LM of GGUF file ``path`` on CPU, its quantized projections
    and embeddings kept in their blocks (module docs).

    Args:
        path: the ``.gguf`` file.
        config: its HF config (``model_loader.load_config``).
        dtype: the activations' and float parameters' dtype (float32 or
            bfloat16).
    Returns:
        The HF model in eval mode, attention routed to pagedrs.
    Raises:
        GGUFLoadError: an unreadable or truncated file, a tensor type pagedrs
            does not run, a tensor whose shape differs from the config's, a
            quantized tensor of a module other than a linear layer or an
            embedding, or a parameter the file does not hold. Nothing stays
            loaded.
    """
    header = _open(path)
    check_tensors(path, header)
    arch = str(header.metadata.get("general.architecture"))
    processor = _processor(arch, config)
    model = _skeleton(config, dtype)
    name_map = _name_map(model, arch)
    modules = dict(model.named_modules())
    biases: dict[str, torch.Tensor] = {}
    embedding: QuantizedWeight | None = None
    for t in header.tensors:
        hf_name = name_map.get(t.name)
        qtype = t.type_name
        if hf_name is None:
            logger.info("%s: tensor %r (%s) is not used by %s", path, t.name, qtype, arch)
            continue
        module_name, _, attr = hf_name.rpartition(".")
        module = modules[module_name]
        param = getattr(module, attr)
        where = f"{path}: tensor {t.name!r} ({qtype}) for {hf_name}"
        if qtype in GGUF_BLOCK_TYPES:
            dims = list(reversed(t.dims))  # GGUF lists the row length first
            if dims != list(param.shape):
                raise GGUFLoadError(
                    f"{where}: shape {dims} does not match the config's {list(param.shape)}"
                )
            n, k = dims
            data = _tensor_view(header.data(t))
            order = _row_order(processor, t.name, n)
            if order is not None:
                data = data[order]  # whole rows, gathered once
            try:
                weight = QuantizedWeight(qtype, (n, k), data)
            except ValueError as e:
                raise GGUFLoadError(f"{where}: {e}") from e
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
        import gguf

        values = gguf.quants.dequantize(header.data(t), gguf.GGMLQuantizationType(t.ggml_type))
        values = np.asarray(processor.process(weights=values, name=t.name).weights)
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
