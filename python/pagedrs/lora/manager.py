"""``LoRAModelManager``: adapters on a model. It wraps the model's decoder
projections (``layers``), keeps the ``max_loras`` adapter slots the wrappers
read, the loaded adapters (``registry``), and each step's token slots from
the step batch's ``seq_lora_ids``.

A slot holds a copy of one adapter's matrices, padded to
``max_lora_rank``; a step's adapters are put in slots before its forward,
reusing the slot an adapter already holds, else a free one, else the least
recently used slot of an adapter not in the step (the scheduler admits at
most ``max_loras`` adapters, so one is always there).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

from ..engine.core.errors import InvalidRequestError
from .adapter import SUPPORTED_MODULES, LoRAAdapter, LoRAError, LoRAWeights
from .gguf_lora import gguf_arch_of
from .layers import LoRAModule, LoRAProjection, LoRAStep, SlotStack
from .registry import LoRARegistry
from .request import LoRARequest

__all__ = ["LoRAModelManager", "add_lora_request"]

_ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP = ("gate_proj", "up_proj", "down_proj")


def add_lora_request(manager: LoRAModelManager | None, req: Any) -> int:
    """Pin the adapter of an engine-core request (an ``AddRequest`` or
    ``AddBeamSearchRequest``: its ``request_id`` and ``lora_request``),
    loading it if need be, until ``manager.release_request``; its
    ``lora_int_id``, 0 without one (the base model).

    Raises:
        InvalidRequestError: (param ``model``) an adapter with no manager (the
            engine runs without ``enable_lora``), or as
            ``LoRAModelManager.add_request``.
    """
    if req.lora_request is None:
        return 0
    if manager is None:
        raise InvalidRequestError(
            f"LoRA adapter {req.lora_request.lora_name!r} requested, but the engine "
            "was started without enable_lora",
            param="model",
        )
    return manager.add_request(req.request_id, req.lora_request)


class LoRAModelManager:
    """Adapters on a ``ModelRunner``'s model.

    Args:
        runner: the in-process ``ModelRunner`` (pagedrs' own Llama-family
            code or HF's modules); its projections are wrapped here and its
            ``lora`` set to this manager.
        max_loras: adapter slots (most adapters in one step).
        max_lora_rank: the largest rank an adapter may have.
        max_cpu_loras: most adapters loaded in host memory.
        reserved_bytes: the bytes set aside for adapters from the KV budget
            (``memory.lora_reserved_bytes``), reported by ``stats``.
    Raises:
        ValueError: a decoder layer without the projections of
            ``adapter.SUPPORTED_MODULES``.
    """

    def __init__(
        self,
        runner: Any,
        max_loras: int,
        max_lora_rank: int,
        max_cpu_loras: int,
        reserved_bytes: int = 0,
    ) -> None:
        self.max_loras = max_loras
        self.reserved_bytes = reserved_bytes
        self.max_lora_rank = max_lora_rank
        self.step = LoRAStep()
        self.stacks: dict[tuple[int, str], SlotStack] = {}
        if runner.native is not None:
            self._wrap_native(runner.native)
        else:
            self._wrap_modules(runner.decoder.layers)
        self.num_layers = len({i for i, _ in self.stacks})
        self.config = runner.model.config
        self.registry = LoRARegistry(max_cpu_loras, max_lora_rank, self.fit, self._unloaded)
        self.slot_ids: list[int | None] = [None] * max_loras
        self.slot_of: dict[int, int] = {}
        self._slot_used = [0] * max_loras
        self._tick = 0
        self._request_lora: dict[str, int] = {}
        runner.lora = self

    # ---------------------------------------------------------------- wrapping

    def _stack(self, layer: int, name: str, in_features: int, out_features: int) -> SlotStack:
        stack = SlotStack(self.max_loras, self.max_lora_rank, in_features, out_features)
        self.stacks[(layer, name)] = stack
        return stack

    def _wrap_native(self, native: Any) -> None:
        hq, hkv, d = native.num_heads, native.num_kv_heads, native.head_dim
        hidden = native.hidden_size
        for i, layer in enumerate(native.layers):
            for parent, names, want in (
                ("self_attn", layer.qkv_names, _ATTN[:3]),
                ("mlp", layer.gate_up_names, _MLP[:2]),
            ):
                if tuple(names) != want:
                    how = f"{'/'.join(names)} fused in the checkpoint; " if names else ""
                    raise ValueError(
                        f"enable_lora: decoder layer {i} has no {parent}.{want[0]} "
                        f"projection ({how}LoRA runs on models with the projections "
                        f"{', '.join(SUPPORTED_MODULES)})"
                    )
            inter = int(layer.gate_up.out_features) // 2
            fused = {
                "qkv": [
                    ("q_proj", hidden, hq * d),
                    ("k_proj", hidden, hkv * d),
                    ("v_proj", hidden, hkv * d),
                ],
                "o_proj": [("o_proj", hq * d, hidden)],
                "gate_up": [("gate_proj", hidden, inter), ("up_proj", hidden, inter)],
                "down_proj": [("down_proj", inter, hidden)],
            }
            for attr, parts in fused.items():
                col, wrapped = 0, []
                for name, k, n in parts:
                    wrapped.append((self._stack(i, name, k, n), col))
                    col += n
                setattr(layer, attr, LoRAProjection(getattr(layer, attr), wrapped, self.step))

    def _wrap_modules(self, layers: Any) -> None:
        for i, layer in enumerate(layers):
            for parent_name, names in (("self_attn", _ATTN), ("mlp", _MLP)):
                parent = getattr(layer, parent_name, None)
                for name in names:
                    module = getattr(parent, name, None)
                    if module is None or not hasattr(module, "in_features"):
                        raise ValueError(
                            f"enable_lora: decoder layer {i} has no {parent_name}.{name} "
                            "projection (LoRA runs on models with the projections "
                            f"{', '.join(SUPPORTED_MODULES)})"
                        )
                    stack = self._stack(i, name, module.in_features, module.out_features)
                    setattr(parent, name, LoRAModule(module, stack, self.step))

    # ---------------------------------------------------------------- adapters

    def check(self, adapter: LoRAAdapter) -> None:
        """Raise unless every matrix of ``adapter`` fits the projection it adapts.

        Raises:
            LoRAError: a layer past the model's, or an ``lora_A`` / ``lora_B``
                whose in / out features differ from the base projection's.
        """
        for (layer, name), w in adapter.weights.items():
            stack = self.stacks.get((layer, name))
            where = f"LoRA adapter {adapter.lora_path}: layers.{layer}.{name}"
            if stack is None:
                raise LoRAError(f"{where}: the base model has {self.num_layers} decoder layers")
            if w.lora_a.shape[1] != stack.in_features:
                raise LoRAError(
                    f"{where}.lora_A {tuple(w.lora_a.shape)}: in_features "
                    f"{w.lora_a.shape[1]} != the base projection's {stack.in_features}"
                )
            if w.lora_b.shape[0] != stack.out_features:
                raise LoRAError(
                    f"{where}.lora_B {tuple(w.lora_b.shape)}: out_features "
                    f"{w.lora_b.shape[0]} != the base projection's {stack.out_features}"
                )

    def fit(self, adapter: LoRAAdapter) -> LoRAAdapter:
        """``adapter`` as this model runs it: its shapes checked (``check``),
        and for a GGUF LoRA file (``gguf_lora``) its ``general.architecture``
        checked against the model's and, for an architecture whose converter
        interleaves the rotary halves of ``attn_q`` / ``attn_k`` rows
        (``gguf_archs.GGUF_ARCHS``' ``qk_permuted``), the ``lora_b`` rows of
        ``q_proj`` / ``k_proj`` put back in HF's order
        (``gguf_archs.qk_row_order``, as the model loader does for weights).

        Raises:
            LoRAError: as ``check``, or a GGUF adapter of another architecture
                than the model's (``general.architecture`` named).
        """
        if adapter.gguf_arch is None:
            self.check(adapter)
            return adapter
        from ..executor.quant.gguf_archs import GGUF_ARCHS, qk_row_order

        want = gguf_arch_of(self.config)
        model_type = getattr(self.config, "model_type", None)
        if adapter.gguf_arch != want:
            raise LoRAError(
                f"LoRA adapter {adapter.lora_path}: general.architecture "
                f"{adapter.gguf_arch!r} does not match the base model's "
                f"({model_type!r}: GGUF architecture {want!r})"
            )
        self.check(adapter)
        if not GGUF_ARCHS[want].qk_permuted:
            return adapter
        heads = {
            "q_proj": int(self.config.num_attention_heads),
            "k_proj": int(getattr(self.config, "num_key_value_heads", None) or 0)
            or int(self.config.num_attention_heads),
        }
        weights = dict(adapter.weights)
        for (layer, name), w in adapter.weights.items():
            if name in heads:
                order = torch.from_numpy(qk_row_order(w.lora_b.shape[0], heads[name]))
                weights[(layer, name)] = LoRAWeights(w.lora_a, w.lora_b[order].contiguous())
        return dataclasses.replace(adapter, weights=weights)

    def add_request(self, request_id: str, lora_request: LoRARequest) -> int:
        """Load (or reuse) a request's adapter and pin it until
        ``release_request``. Returns its ``lora_int_id``.

        Raises:
            InvalidRequestError: (param ``model``) as ``LoRARegistry.load``,
                naming the file, field or tensor.
        """
        try:
            adapter = self.registry.load(lora_request, pin=True)
        except LoRAError as e:
            raise InvalidRequestError(str(e), param="model") from e
        self._request_lora[request_id] = adapter.lora_int_id
        return adapter.lora_int_id

    def release_request(self, request_id: str) -> None:
        """Unpin the adapter of a finished request (no-op for others)."""
        lora_int_id = self._request_lora.pop(request_id, None)
        if lora_int_id is not None:
            self.registry.release(lora_int_id)

    def _unloaded(self, lora_int_id: int) -> None:
        """An adapter was unloaded (its id may be bound anew): empty its slot.
        (An adapter evicted from host memory keeps its slot: the slot holds a
        copy.)"""
        slot = self.slot_of.pop(lora_int_id, None)
        if slot is not None:
            self.slot_ids[slot] = None
            for stack in self.stacks.values():
                stack.set(slot, None, 0.0)

    # -------------------------------------------------------------------- step

    def set_step(self, batch: Any) -> None:
        """Put the step's adapters in slots and set each token's slot
        (``batch.seq_lora_ids``, ``batch.query_start_loc``).

        Raises:
            RuntimeError: more distinct adapters than ``max_loras`` (the
                scheduler's admission bounds them), or one evicted from host
                memory that cannot be read again.
        """
        ids = batch.seq_lora_ids
        if not ids.any():
            self.step.slots = None
            return
        wanted = [int(i) for i in np.unique(ids) if i != 0]
        if len(wanted) > self.max_loras:
            raise RuntimeError(f"a step of {len(wanted)} adapters, over max_loras={self.max_loras}")
        self._tick += 1
        for lora_int_id in wanted:
            slot = self.slot_of.get(lora_int_id)
            if slot is None:
                slot = self._free_slot(set(wanted))
                self._fill(slot, lora_int_id)
            self._slot_used[slot] = self._tick
        table = {i: self.slot_of[i] for i in wanted}
        seq_slots = np.array([table.get(int(i), -1) for i in ids], dtype=np.int32)
        counts = np.diff(batch.query_start_loc)
        self.step.slots = np.repeat(seq_slots, counts).astype(np.int32)

    def clear_step(self) -> None:
        """No adapter until the next ``set_step``."""
        self.step.slots = None

    def _free_slot(self, keep: set[int]) -> int:
        for slot, held in enumerate(self.slot_ids):
            if held is None:
                return slot
        free = [s for s, held in enumerate(self.slot_ids) if held not in keep]
        return min(free, key=lambda s: self._slot_used[s])

    def _fill(self, slot: int, lora_int_id: int) -> None:
        if lora_int_id in self.registry:
            adapter = self.registry.get(lora_int_id)
        else:  # evicted from host memory while its request waited: read it again
            try:
                adapter = self.registry.load(self.registry.request_of(lora_int_id))
            except (KeyError, LoRAError) as e:
                raise RuntimeError(f"adapter {lora_int_id} cannot be read again: {e}") from e
        old = self.slot_ids[slot]
        if old is not None:
            self.slot_of.pop(old, None)
        for key, stack in self.stacks.items():
            stack.set(slot, adapter.weights.get(key), adapter.scaling)
        self.slot_ids[slot] = lora_int_id
        self.slot_of[lora_int_id] = slot

    # ------------------------------------------------------------------- stats

    def stats(self) -> dict[str, Any]:
        """``lora_bytes`` (the loaded adapters' matrices), ``lora_slot_bytes``
        (the slots' padded copies), ``lora_reserved_bytes`` (the most the two
        may take, set aside from the KV budget), ``num_loaded_loras``,
        ``max_loras``."""
        return {
            "lora_bytes": self.registry.nbytes,
            "lora_slot_bytes": sum(s.nbytes for s in self.stacks.values()),
            "lora_reserved_bytes": self.reserved_bytes,
            "num_loaded_loras": len(self.registry),
            "max_loras": self.max_loras,
        }
