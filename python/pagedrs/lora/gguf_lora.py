"""Reading llama.cpp's GGUF LoRA adapter files into a ``LoRAAdapter``.

The layout is the one llama.cpp's ``convert_lora_to_gguf.py`` writes and
``src/llama-adapter.cpp`` reads:

- metadata ``general.type = "adapter"``, ``adapter.type = "lora"``,
  ``adapter.lora.alpha`` (float32) and ``general.architecture`` (the base
  model's GGUF architecture);
- per adapted base tensor ``<name>`` (``blk.3.attn_q.weight``) the pair
  ``<name>.lora_a`` (GGUF dims ``[in, r]``, so ``[r, in]`` row-major, PEFT's
  ``lora_A``) and ``<name>.lora_b`` (dims ``[r, out]``: ``[out, r]``, PEFT's
  ``lora_B``);
- the scaling is ``alpha / r``, with ``r`` the rows of ``lora_a``; an
  ``adapter.lora.alpha`` of 0 or none means a scaling of 1 (llama.cpp's
  ``llama_adapter_lora_weight::get_scale``; GGUF has no rsLoRA);
- the converter writes the base model's tensors as its architecture's
  converter does, so for the architectures whose ``attn_q`` / ``attn_k`` rows
  are in llama.cpp's interleaved rotary order (``gguf_archs.GGUF_ARCHS``'
  ``qk_permuted``: llama, granite) so are the rows of their ``lora_b``;
  ``LoRAModelManager.fit`` puts them back in HF's order, which needs the
  model's head counts.

Tensor names map to the decoder projections through gguf-py's tensor name
table of the architecture (``get_tensor_name_map``, as the converter names
them). F32, F16 and BF16 tensors are read as they are; the quantized types
gguf-py dequantizes (``Q8_0``, which the converter writes with
``--outtype q8_0``, and the others) are dequantized to float32 with
``gguf.quants.dequantize``; any other type is refused naming the tensor.
Refused too, naming the key or tensor: a file that is not a readable GGUF,
a ``general.type`` other than ``adapter``, an ``adapter.type`` other than
``lora``, activated LoRA (``adapter.alora.invocation_tokens``), an
architecture gguf-py does not know, tensors that are not ``lora_a`` /
``lora_b`` of a supported decoder projection (embedding and output
adapters, the norms ``mergekit-extract-lora`` adds, fused ``attn_qkv``),
a pair missing one half, matrices whose shapes are not ``[r, in]`` /
``[out, r]``, ranks that differ between tensors or exceed
``max_lora_rank``, and non-finite values.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
import torch

from ..executor.quant.gguf_header import GGUFHeader, GGUFHeaderError, GGUFTensorInfo, read_header
from .adapter import SUPPORTED_MODULES, LoRAAdapter, LoRAError, LoRAWeights

__all__ = ["load_gguf_adapter"]

_PARENT = {
    "q_proj": "self_attn",
    "k_proj": "self_attn",
    "v_proj": "self_attn",
    "o_proj": "self_attn",
    "gate_proj": "mlp",
    "up_proj": "mlp",
    "down_proj": "mlp",
}
_BLOCK = re.compile(r"^blk\.(\d+)\.")


def _refuse(path: str, what: str) -> LoRAError:
    return LoRAError(f"LoRA adapter {path}: {what}")


def _projection_names(path: str, arch: str, num_blocks: int) -> dict[str, tuple[int, str]]:
    """GGUF base tensor name (``blk.0.attn_q.weight``) -> (layer, projection)
    for every supported projection of ``num_blocks`` layers, from gguf-py's
    name table of ``arch``."""
    import gguf

    archs = {name: key for key, name in gguf.MODEL_ARCH_NAMES.items()}
    if arch not in archs:
        raise _refuse(path, f"general.architecture {arch!r} is unknown to gguf-py")
    table = gguf.get_tensor_name_map(archs[arch], num_blocks)
    out: dict[str, tuple[int, str]] = {}
    for layer in range(num_blocks):
        for module in SUPPORTED_MODULES:
            name = table.get_name(f"model.layers.{layer}.{_PARENT[module]}.{module}")
            if name is not None:
                out[f"{name}.weight"] = (layer, module)
    return out


def _values(path: str, header: GGUFHeader, t: GGUFTensorInfo) -> torch.Tensor:
    """A 2-D tensor's values, float32 ``[rows, row length]``."""
    import gguf

    if len(t.dims) != 2:
        raise _refuse(path, f"tensor {t.name!r} has {len(t.dims)} dimensions, not 2")
    qtype = gguf.GGMLQuantizationType(t.ggml_type)
    try:
        values = gguf.quants.dequantize(header.data(t), qtype)
    except NotImplementedError:
        raise _refuse(
            path,
            f"tensor {t.name!r} is of ggml type {t.type_name}, which pagedrs does not read "
            "(F32, F16, BF16 or a type gguf-py dequantizes, such as Q8_0)",
        ) from None
    except GGUFHeaderError as e:
        raise _refuse(path, str(e)) from e
    out = torch.from_numpy(np.array(values, dtype=np.float32)).reshape(t.dims[1], t.dims[0])
    if not torch.isfinite(out).all():
        raise _refuse(path, f"tensor {t.name!r} holds non-finite values")
    return out


def _metadata(path: str, header: GGUFHeader) -> tuple[str, float]:
    """(``general.architecture``, ``adapter.lora.alpha``), the other keys checked."""
    meta = header.metadata
    kind = meta.get("general.type")
    if kind != "adapter":
        raise _refuse(
            path,
            f"general.type is {kind!r}, not 'adapter' (a GGUF LoRA adapter file, as "
            "llama.cpp's convert_lora_to_gguf.py writes it, is expected)",
        )
    adapter_type = meta.get("adapter.type")
    if adapter_type != "lora":
        raise _refuse(path, f"adapter.type is {adapter_type!r}, not 'lora'")
    if "adapter.alora.invocation_tokens" in meta:
        raise _refuse(
            path, "adapter.alora.invocation_tokens: activated LoRA (aLoRA) is not supported"
        )
    arch = meta.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise _refuse(path, f"general.architecture is {arch!r}, not a GGUF architecture name")
    alpha = meta.get("adapter.lora.alpha", 0.0)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
        raise _refuse(path, f"adapter.lora.alpha must be a finite number, got {alpha!r}")
    return arch, float(alpha)


def _pairs(
    path: str, header: GGUFHeader, names: dict[str, tuple[int, str]]
) -> dict[tuple[int, str], dict[str, GGUFTensorInfo]]:
    """The ``lora_a`` / ``lora_b`` tensors by (layer, projection)."""
    parts: dict[tuple[int, str], dict[str, GGUFTensorInfo]] = {}
    for t in header.tensors:
        base, dot, half = t.name.rpartition(".")
        if not dot or half not in ("lora_a", "lora_b"):
            what = (
                "a norm weight (mergekit-extract-lora's; only lora_a / lora_b pairs are read)"
                if t.name.endswith("norm.weight")
                else "not a .lora_a / .lora_b tensor"
            )
            raise _refuse(path, f"tensor {t.name!r} is {what}")
        key = names.get(base)
        if key is None:
            raise _refuse(
                path,
                f"tensor {t.name!r}: {base!r} is not a supported decoder projection "
                f"({', '.join(SUPPORTED_MODULES)}; embedding and output adapters are "
                "not supported)",
            )
        parts.setdefault(key, {})[half] = t
    return parts


def load_gguf_adapter(
    path: str, lora_int_id: int, lora_name: str, max_lora_rank: int
) -> LoRAAdapter:
    """Read a GGUF LoRA adapter file into float32 matrices (module docs).

    Args:
        path: the ``.gguf`` file.
        lora_int_id, lora_name: the ``LoRARequest``'s.
        max_lora_rank: the engine's ``max_lora_rank``.
    Returns:
        the adapter, its ``gguf_arch`` set: its matrices as the file holds
        them (``attn_q`` / ``attn_k`` ``lora_b`` rows still interleaved for a
        ``qk_permuted`` architecture); ``LoRAModelManager.fit`` checks it
        against a model and puts those rows in HF's order.
    Raises:
        LoRAError: naming the file and the key or tensor (module docs).
    """
    try:
        header = read_header(path)
    except (GGUFHeaderError, OSError) as e:
        raise _refuse(
            path, f"is not a readable GGUF file, truncated or corrupt ({type(e).__name__}: {e})"
        ) from e
    arch, alpha = _metadata(path, header)
    blocks = [int(m.group(1)) for t in header.tensors if (m := _BLOCK.match(t.name))]
    names = _projection_names(path, arch, max(blocks, default=-1) + 1)
    parts = _pairs(path, header, names)
    if not parts:
        raise _refuse(path, "holds no LoRA tensors")
    weights: dict[tuple[int, str], LoRAWeights] = {}
    rank: int | None = None
    for (layer, module), ab in sorted(parts.items()):
        where = f"layers.{layer}.{module}"
        if set(ab) != {"lora_a", "lora_b"}:
            (only,) = ab.values()
            raise _refuse(path, f"tensor {only.name!r} ({where}) has no pair")
        a = _values(path, header, ab["lora_a"])
        b = _values(path, header, ab["lora_b"])
        if a.shape[0] != b.shape[1]:
            raise _refuse(
                path,
                f"tensors {ab['lora_a'].name!r} {tuple(a.shape)} and {ab['lora_b'].name!r} "
                f"{tuple(b.shape)} are not [r, in] and [out, r] of one rank",
            )
        r = int(a.shape[0])
        if rank is not None and r != rank:
            raise _refuse(
                path, f"tensor {ab['lora_a'].name!r} has rank {r}, other tensors rank {rank}"
            )
        if r > max_lora_rank:
            raise _refuse(
                path,
                f"tensor {ab['lora_a'].name!r} has rank {r}, over the engine's "
                f"max_lora_rank={max_lora_rank}",
            )
        rank = r
        weights[(layer, module)] = LoRAWeights(a.contiguous(), b.contiguous())
    assert rank is not None
    scaling = alpha / rank if alpha else 1.0
    return LoRAAdapter(lora_int_id, lora_name, path, rank, scaling, weights, gguf_arch=arch)


def gguf_arch_of(config: Any) -> str | None:
    """The GGUF architecture llama.cpp's converter writes for an HF config
    (``gguf_archs.GGUF_ARCHS`` read backwards; Mistral's is ``llama``), or
    None for a model type pagedrs loads from no GGUF architecture."""
    from ..executor.quant.gguf_archs import GGUF_ARCHS

    by_type = {spec.model_type: arch for arch, spec in GGUF_ARCHS.items()}
    by_type["mistral"] = "llama"
    return by_type.get(str(getattr(config, "model_type", "")))
