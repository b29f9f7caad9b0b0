"""KV cache tensors, per KV cache group (hybrid KV cache, as vLLM v1's).

Layers of one attention type (full attention, or one sliding window) form KV
cache groups of at most ``group_size`` layers each; all groups share one paged
pool. The pool holds ``group_size`` (key, value) tensor pairs, each
``[num_blocks, Hkv, bs, E]`` of the KV cache dtype's storage (``E`` its entry
size: ``D`` values, or for int8 ``D`` values and a 2-byte scale; see
``attention.kv_cache_dtype``): the ``k``-th layer of every group uses pair
``k``. A block id belongs to one group at a time (the scheduler keeps one block
table per group), so the layers of different groups never write the same
memory. A sliding-window group holds only the blocks of its window per
sequence; the blocks behind it go back to the pool.
"""

from __future__ import annotations

import math
import mmap
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..attention.kv_cache_dtype import KVCacheDtype, resolve_kv_cache_dtype

#: Most padding (unused tensor-pair slots of groups smaller than
#: ``group_size``) the grouping accepts, as a fraction of the layers.
MAX_GROUP_PADDING = 0.10

#: Model types whose attention modules pass ``config.sliding_window`` to every
#: layer, whatever ``config.layer_types`` says (transformers 5).
_CONFIG_WIDE_WINDOW = ("mistral", "mixtral", "phi3", "starcoder2", "qwen3_moe")


def _zeroed_cpu(
    shape: tuple[int, ...], *, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """A zero-filled CPU tensor of ``shape`` and ``dtype`` on an anonymous
    memory map (page aligned), whose pages the OS commits on first write; the
    map is released with the last view of the tensor."""
    assert device.type == "cpu"
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes == 0:
        return torch.zeros(shape, dtype=dtype)
    raw = torch.frombuffer(mmap.mmap(-1, nbytes), dtype=torch.uint8)
    return raw.view(dtype).view(shape)


@dataclass(frozen=True)
class KVCacheGroupSpec:
    """One KV cache group: layers of one attention type sharing block tables.

    Attributes:
        sliding_window: the window of every layer of the group, in tokens (the
            query at position ``p`` sees keys ``p - W < k <= p``), or None for
            full attention.
        layers: the group's model layers, ascending; the ``k``-th uses the
            pool's tensor pair ``k``.
    """

    sliding_window: int | None
    layers: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"sliding_window must be >= 1 or None, got {self.sliding_window}")
        if not self.layers:
            raise ValueError("a KV cache group needs at least one layer")


@dataclass(frozen=True)
class KVCacheSpec:
    """Shape of the paged KV cache of a model.

    Attributes:
        num_layers: decoder layers.
        num_kv_heads: KV heads per layer (GQA).
        head_dim: channels per head.
        block_size: tokens per block.
        dtype: the model's dtype (what attention computes in).
        groups: the KV cache groups, in the scheduler's order (its
            ``kv_cache_groups`` and ``StepBatch.kv_groups``); every layer in
            exactly one. Default (empty): one full-attention group of all
            layers.
        kv_cache_dtype: the ``kv_cache_dtype`` setting (a name of
            ``attention.kv_cache_dtype.KV_CACHE_DTYPES``; "auto": ``dtype``).
    Raises:
        ValueError: groups that do not hold each layer once, or an unknown
            ``kv_cache_dtype``.
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: torch.dtype
    groups: tuple[KVCacheGroupSpec, ...] = field(default=())
    kv_cache_dtype: str = "auto"

    def __post_init__(self) -> None:
        resolve_kv_cache_dtype(self.kv_cache_dtype, self.dtype)  # raises on a bad name
        if not self.groups:
            full = KVCacheGroupSpec(None, tuple(range(self.num_layers)))
            object.__setattr__(self, "groups", (full,))
        object.__setattr__(self, "groups", tuple(self.groups))
        layers = sorted(layer for g in self.groups for layer in g.layers)
        if layers != list(range(self.num_layers)):
            raise ValueError(
                f"KV cache groups must hold each of the {self.num_layers} layers once, "
                f"got {[g.layers for g in self.groups]}"
            )

    @classmethod
    def from_config(
        cls,
        config: Any,
        block_size: int,
        dtype: torch.dtype,
        hybrid: bool = True,
        kv_cache_dtype: str = "auto",
    ) -> KVCacheSpec:
        """Read layer, head and head-dim counts and each layer's sliding window
        from an HF config, and group the layers (``kv_cache_groups``).

        Args:
            hybrid: group layers by attention type, so sliding-window layers
                hold only their window's blocks; False: one full-attention
                group of all layers (windows still apply in attention, but
                every token keeps its blocks).
            kv_cache_dtype: as the attribute.
        """
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        windows = layer_sliding_windows(config)
        return cls(
            num_layers=config.num_hidden_layers,
            num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=head_dim,
            block_size=block_size,
            dtype=dtype,
            groups=kv_cache_groups(windows, hybrid=hybrid),
            kv_cache_dtype=kv_cache_dtype,
        )

    @property
    def group_size(self) -> int:
        """Most layers in one group: the tensor pairs of the pool."""
        return max(len(g.layers) for g in self.groups)

    @property
    def sliding_windows(self) -> list[int | None]:
        """Each group's window (None: full attention), the scheduler's
        ``kv_cache_groups``."""
        return [g.sliding_window for g in self.groups]

    @property
    def layer_groups(self) -> tuple[int, ...]:
        """The group index of each model layer."""
        out = [0] * self.num_layers
        for gi, g in enumerate(self.groups):
            for layer in g.layers:
                out[layer] = gi
        return tuple(out)

    @property
    def layer_slots(self) -> tuple[int, ...]:
        """The tensor pair of each model layer (its place in its group)."""
        out = [0] * self.num_layers
        for g in self.groups:
            for k, layer in enumerate(g.layers):
                out[layer] = k
        return tuple(out)

    @property
    def cache_dtype(self) -> KVCacheDtype:
        """The KV cache's storage format (``kv_cache_dtype`` resolved)."""
        return resolve_kv_cache_dtype(self.kv_cache_dtype, self.dtype)

    @property
    def entry_size(self) -> int:
        """Last dim of the cache tensors (``E``, storage elements per token and KV head)."""
        return self.cache_dtype.entry_size(self.head_dim)

    @property
    def entry_bytes(self) -> int:
        """Bytes of one token's key (or value) of one KV head, int8 scale included."""
        return self.cache_dtype.entry_bytes(self.head_dim)

    @property
    def bytes_per_block(self) -> int:
        """Bytes one block id costs across the pool: keys and values of
        ``group_size`` layers (``2 * group_size * Hkv * bs * entry_bytes``),
        int8 scales included."""
        return 2 * self.group_size * self.num_kv_heads * self.block_size * self.entry_bytes

    def num_blocks(self, kv_cache_memory_bytes: int) -> int:
        """Blocks that fit in a KV budget of ``kv_cache_memory_bytes`` bytes."""
        return kv_cache_memory_bytes // self.bytes_per_block

    def allocate(
        self, num_blocks: int, device: torch.device
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The pool: ``group_size`` ``(key_cache, value_cache)`` pairs, each
        ``[num_blocks, Hkv, bs, E]`` of ``cache_dtype.storage``
        (``layer_caches`` maps layers to them)."""
        shape = (num_blocks, self.num_kv_heads, self.block_size, self.entry_size)
        storage = self.cache_dtype.storage
        # Slots past a sequence's length are masked out of the softmax but still
        # multiplied by zero weights in the torch path, so they must hold finite
        # values: zero bytes are zero in every format, an int8 entry's scale
        # included. ``torch.empty`` is no way to get them: the allocator hands back
        # freed memory of earlier tensors (as often as not for a pool's
        # per-layer tensors of a few MB), whose bytes read as NaN or inf in float16
        # or bfloat16. On CPU each tensor is an anonymous memory map instead:
        # zero-filled by the OS and committed page by page as blocks are first
        # written (``torch.zeros`` would touch the whole budget up front).
        alloc = _zeroed_cpu if device.type == "cpu" else torch.zeros
        return [
            (
                alloc(shape, dtype=storage, device=device),
                alloc(shape, dtype=storage, device=device),
            )
            for _ in range(self.group_size)
        ]

    def layer_caches(
        self, pool: Sequence[tuple[torch.Tensor, torch.Tensor]]
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The pool's pair of each model layer (a list indexed by layer; the
        same tensors, not copies)."""
        if len(pool) != self.group_size:
            raise ValueError(f"expected {self.group_size} cache pairs, got {len(pool)}")
        return [pool[k] for k in self.layer_slots]

    def describe(self) -> str:
        """One line per group: its window and layers (for the start-up log)."""
        lines = []
        for gi, g in enumerate(self.groups):
            kind = "full attention" if g.sliding_window is None else f"window {g.sliding_window}"
            lines.append(f"group {gi}: {kind}, layers {list(g.layers)}")
        return "; ".join(lines)


def layer_sliding_windows(config: Any) -> list[int | None]:
    """The sliding window (tokens) of each decoder layer, None for full
    attention, as transformers 5's attention modules apply it.

    ``config.layer_types`` decides where present ("sliding_attention" layers
    get ``config.sliding_window``), except for the model types whose modules
    pass ``config.sliding_window`` to every layer (Mistral, Mixtral, Phi3,
    Starcoder2, Qwen3-MoE). Without ``layer_types``: the config-wide
    ``sliding_window`` (Qwen2 / Qwen3 and Qwen2-MoE only with
    ``use_sliding_window``, under their ``max_window_layers`` rules).
    """
    n = config.num_hidden_layers
    model_type = getattr(config, "model_type", None)
    window = getattr(config, "sliding_window", None) or None
    if model_type in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe") and not getattr(
        config, "use_sliding_window", False
    ):
        window = None  # what their configs do (sliding_window None or 0)
    if window is not None:
        window = int(window)
    if model_type in _CONFIG_WIDE_WINDOW:
        return [window] * n
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        if len(layer_types) != n:
            raise ValueError(f"config.layer_types has {len(layer_types)} entries for {n} layers")
        return [window if t == "sliding_attention" else None for t in layer_types]
    if window is None:
        return [None] * n
    max_window_layers = getattr(config, "max_window_layers", None)
    if model_type in ("qwen2", "qwen3") and max_window_layers is not None:
        return [window if i >= max_window_layers else None for i in range(n)]
    if model_type == "qwen2_moe" and max_window_layers is not None:
        return [window if i % 2 == 0 and i < max_window_layers else None for i in range(n)]
    return [window] * n


def _padding(counts: Sequence[int], size: int) -> int:
    return sum(math.ceil(c / size) * size - c for c in counts)


def kv_cache_groups(
    windows: Sequence[int | None], hybrid: bool = True
) -> tuple[KVCacheGroupSpec, ...]:
    """Group layers by window (vLLM v1's hybrid KV cache rule).

    Layers of equal window form a type. One type (or ``hybrid=False``): one
    group of all layers (full attention with ``hybrid=False``). Several: the
    group size is the largest ``gs`` up to the smallest type's layer count
    whose padding (``sum(ceil(n_t / gs) * gs - n_t)``) is at most
    ``MAX_GROUP_PADDING`` of the layers (their gcd has none); each type's
    layers are cut, in order, into ``ceil(n_t / gs)`` groups of consecutive
    layers. Full-attention groups come first, then by window, then by first
    layer.

    Args:
        windows: each layer's window (tokens), or None (full attention).
        hybrid: False gives one full-attention group of all layers.
    """
    n = len(windows)
    if n == 0:
        raise ValueError("a model needs at least one layer")
    types: dict[int | None, list[int]] = {}
    for layer, w in enumerate(windows):
        types.setdefault(w, []).append(layer)
    if not hybrid:
        return (KVCacheGroupSpec(None, tuple(range(n))),)
    if len(types) == 1:
        (w,) = types
        return (KVCacheGroupSpec(w, tuple(range(n))),)
    counts = [len(v) for v in types.values()]
    size = next(
        gs
        for gs in range(min(counts), 0, -1)
        if _padding(counts, gs) <= MAX_GROUP_PADDING * n  # gs = gcd: none
    )
    groups = [
        KVCacheGroupSpec(w, tuple(layers[i : i + size]))
        for w, layers in types.items()
        for i in range(0, len(layers), size)
    ]
    groups.sort(key=lambda g: (g.sliding_window is not None, g.sliding_window or 0, g.layers[0]))
    return tuple(groups)
