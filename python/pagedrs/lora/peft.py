"""Reading PEFT LoRA adapter folders (``adapter_config.json`` and
``adapter_model.safetensors``, as ``PeftModel.save_pretrained`` writes them)
into a ``LoRAAdapter``, every unsupported feature refused by name.

What is read: ``r``, ``lora_alpha``, ``use_rslora`` (scaling ``lora_alpha /
r``, or ``lora_alpha / sqrt(r)``), ``target_modules`` (the projections of
``adapter.SUPPORTED_MODULES``), and the tensors
``...layers.<i>.<self_attn|mlp>.<name>.lora_A.weight`` / ``lora_B.weight``.
Refused: other PEFT methods, DoRA, LoRA biases, trained base biases,
``modules_to_save``, embedding and LM-head targets, per-module
``rank_pattern`` / ``alpha_pattern``, ``fan_in_fan_out``, a rank above
``max_lora_rank`` and pickled ``adapter_model.bin`` files. (llama.cpp's GGUF
LoRA files are read by ``gguf_lora``.)
"""

from __future__ import annotations

import json
import math
import os
import re
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from .adapter import SUPPORTED_MODULES, LoRAAdapter, LoRAError, LoRAWeights

__all__ = ["load_peft_adapter", "read_adapter_config"]

CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"

_KEY = re.compile(
    r"^(?:.*\.)?layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.\w+)?\.weight$"
)
#: Targets refused by name (their tensors are not decoder projections).
_REFUSED_TARGETS = ("embed_tokens", "lm_head", "embed", "wte", "output")


def _refuse(path: str, what: str) -> LoRAError:
    return LoRAError(f"LoRA adapter {path}: {what}")


def read_adapter_config(path: str) -> dict[str, Any]:
    """The adapter folder's ``adapter_config.json``, checked.

    Raises:
        LoRAError: a missing folder or file, invalid JSON,
            or a field naming a feature pagedrs does not run.
    """
    cfg_path = os.path.join(path, CONFIG_NAME)
    if not os.path.isdir(path):
        raise _refuse(path, "no such folder")
    if not os.path.isfile(cfg_path):
        ggufs = sorted(f for f in os.listdir(path) if f.endswith(".gguf"))
        why = f" (for a GGUF LoRA adapter pass the file: {ggufs[0]})" if ggufs else ""
        raise _refuse(path, f"no {CONFIG_NAME} in the folder{why}")
    try:
        with open(cfg_path, encoding="utf-8") as f:
            cfg = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _refuse(cfg_path, f"cannot be read as JSON ({e})") from e
    if not isinstance(cfg, dict):
        raise _refuse(cfg_path, "is not a JSON object")
    peft_type = str(cfg.get("peft_type", "LORA")).upper()
    if peft_type != "LORA":
        raise _refuse(cfg_path, f"peft_type {peft_type!r} is not supported (only LORA)")
    for name, ok in (
        ("use_dora", not cfg.get("use_dora")),
        ("lora_bias", not cfg.get("lora_bias")),
        ("fan_in_fan_out", not cfg.get("fan_in_fan_out")),
        ("modules_to_save", not cfg.get("modules_to_save")),
        ("rank_pattern", not cfg.get("rank_pattern")),
        ("alpha_pattern", not cfg.get("alpha_pattern")),
        ("bias", cfg.get("bias", "none") in (None, "none")),
    ):
        if not ok:
            raise _refuse(cfg_path, f"{name}={cfg.get(name)!r} is not supported")
    r, alpha = cfg.get("r"), cfg.get("lora_alpha")
    if not isinstance(r, int) or isinstance(r, bool) or r < 1:
        raise _refuse(cfg_path, f"r must be a positive integer, got {r!r}")
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool):
        raise _refuse(cfg_path, f"lora_alpha must be a number, got {alpha!r}")
    targets = cfg.get("target_modules")
    names = [targets] if isinstance(targets, str) else list(targets or [])
    for t in names:
        leaf = str(t).split(".")[-1]
        if leaf in _REFUSED_TARGETS:
            raise _refuse(
                cfg_path,
                f"target_modules {t!r}: embedding and LM-head adapters are not supported "
                f"(supported: {', '.join(SUPPORTED_MODULES)})",
            )
    return cfg


def load_peft_adapter(
    path: str, lora_int_id: int, lora_name: str, max_lora_rank: int
) -> LoRAAdapter:
    """Read a PEFT LoRA folder into float32 matrices.

    Args:
        path: the folder.
        lora_int_id, lora_name: the ``LoRARequest``'s.
        max_lora_rank: the engine's ``max_lora_rank``.
    Returns:
        the adapter; its shapes are checked against a model by
        ``LoRAModelManager.check``.
    Raises:
        LoRAError: as ``read_adapter_config``; no safetensors file (a pickled
            ``adapter_model.bin`` is refused), a corrupt one, a tensor that
            is not a supported decoder projection's ``lora_A`` / ``lora_B``,
            a rank other than ``r`` or above ``max_lora_rank``, or a
            projection with only one of its two matrices.
    """
    cfg = read_adapter_config(path)
    cfg_path = os.path.join(path, CONFIG_NAME)
    r = int(cfg["r"])
    if r > max_lora_rank:
        raise _refuse(cfg_path, f"r={r} exceeds the engine's max_lora_rank={max_lora_rank}")
    alpha = float(cfg["lora_alpha"])
    scaling = alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r
    file = os.path.join(path, WEIGHTS_NAME)
    if not os.path.isfile(file):
        extra = (
            " (pickled adapter_model.bin files are not read)"
            if os.path.isfile(os.path.join(path, "adapter_model.bin"))
            else ""
        )
        raise _refuse(path, f"no {WEIGHTS_NAME}{extra}")
    parts: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    try:
        with safe_open(file, framework="pt") as f:
            for key in f.keys():
                m = _KEY.match(key)
                if m is None or m.group(2) not in SUPPORTED_MODULES:
                    raise _refuse(
                        file,
                        f"tensor {key!r} is not the lora_A / lora_B weight of a decoder "
                        f"projection ({', '.join(SUPPORTED_MODULES)})",
                    )
                t = f.get_tensor(key)
                parts.setdefault((int(m.group(1)), m.group(2)), {})[m.group(3)] = t
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        if isinstance(e, LoRAError):
            raise
        raise _refuse(file, f"is not a valid safetensors file ({e})") from e
    if not parts:
        raise _refuse(file, "holds no LoRA tensors")
    weights: dict[tuple[int, str], LoRAWeights] = {}
    for (layer, module), ab in sorted(parts.items()):
        where = f"layers.{layer}.{module}"
        if set(ab) != {"A", "B"}:
            raise _refuse(file, f"{where} has lora_{''.join(ab)} without its pair")
        a, b = ab["A"], ab["B"]
        if a.dim() != 2 or b.dim() != 2 or a.shape[0] != r or b.shape[1] != r:
            raise _refuse(
                file,
                f"{where}: lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)} are not "
                f"[r, in] and [out, r] with r={r} (adapter_config.json's r)",
            )
        if not (a.is_floating_point() and b.is_floating_point()):
            raise _refuse(file, f"{where}: lora_A / lora_B must be floating point")
        a32, b32 = a.float().contiguous(), b.float().contiguous()
        if not (torch.isfinite(a32).all() and torch.isfinite(b32).all()):
            raise _refuse(file, f"{where}: lora_A / lora_B hold non-finite values")
        weights[(layer, module)] = LoRAWeights(a32, b32)
    return LoRAAdapter(lora_int_id, lora_name, path, r, scaling, weights)
