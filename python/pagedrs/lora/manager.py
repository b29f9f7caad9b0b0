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

from typing import Any

import numpy as np

from ..engine.core.errors import InvalidRequestError
from .adapter import SUPPORTED_MODULES, LoRAAdapter, LoRAError
from .layers import LoRAModule, LoRAProjection, LoRAStep, SlotStack
from .registry import LoRARegistry
from .request import LoRARequest

__all__ = ["LoRAModelManager"]

_ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP = ("gate_proj", "up_proj", "down_proj")


class LoRAModelManager:
    """Adapters on a ``ModelRunner``'s model.

    Args:
        runner: the in-process ``ModelRunner`` (pagedrs' own Llama-family
            code or HF's modules); its projections are wrapped here and its
            ``lora`` set to this manager.
        max_loras: adapter slots (most adapters in one step).
        max_lora_rank: the largest rank an adapter may have.
        max_cpu_loras: most adapters loaded in host memory.
    Raises:
        ValueError: a decoder layer without the projections of
            ``adapter.SUPPORTED_MODULES``.
    """

    def __init__(self, runner: Any, max_loras: int, max_lora_rank: int, max_cpu_loras: int) -> None:
        self.max_loras = max_loras
        self.max_lora_rank = max_lora_rank
        self.step = LoRAStep()
        self.stacks: dict[tuple[int, str], SlotStack] = {}
        if runner.native is not None:
            self._wrap_native(runner.native)
        else:
            self._wrap_modules(runner.decoder.layers)
        self.num_layers = len({i for i, _ in self.stacks})
        self.registry = LoRARegistry(max_cpu_loras, max_lora_rank, self.check, self._unloaded)
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
                    raise ValueError(
                        f"enable_lora: decoder layer {i} has no {parent}.{want[0]} "
                        f"projection ({'/'.join(names)} fused in the checkpoint; LoRA runs "
                        f"on models with the projections {', '.join(SUPPORTED_MODULES)})"
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
        (the slots' padded copies), ``num_loaded_loras``, ``max_loras``."""
        return {
            "lora_bytes": self.registry.nbytes,
            "lora_slot_bytes": sum(s.nbytes for s in self.stacks.values()),
            "num_loaded_loras": len(self.registry),
            "max_loras": self.max_loras,
        }
