"""How the process's C heap (glibc ``malloc``) keeps the memory a CPU step
frees, so the next step reuses it instead of faulting in fresh pages.

A CPU step allocates its activations anew at every call (torch tensors, the
Rust kernels' quantized activation rows), and a 2,048-token prefill of a 1B
model allocates buffers of 64-128 MB. glibc serves a request above its mmap
threshold (128 KiB, raised dynamically up to 32 MiB) with a fresh ``mmap``
and unmaps it on free, and trims the heap's free top beyond its trim
threshold: every such buffer is then faulted in page by page (and zeroed by
the kernel) again at the next call, which costs about as much as computing
it (a [2048, 8192] float32 product takes ~35 ms fresh, ~6 ms reused, on an
AMD EPYC Zen 5 core). ``keep_freed_memory`` sets both thresholds once the
weights and the KV cache are allocated, so the step's buffers come from the
heap and stay there. torch asks for 64-byte aligned memory, which glibc
serves from a free chunk only with room for the alignment, so the first
steps may still grow the heap; the later ones reuse it. What the heap keeps
beyond the memory in use (a step's largest buffers and the fragments
between them) raises the peak resident set: by up to 0.2 GiB over a 1B
model's run with a 2,048-token prefill (on 2.0 GiB).
The loaded weights and the cache are allocated before, and no computed
value changes.
"""

from __future__ import annotations

import ctypes
import ctypes.util

#: glibc's ``mallopt`` parameters (``malloc.h``).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

#: Requests up to this many bytes come from the heap, and this much free
#: memory at the heap's top is kept rather than returned (1 GiB).
KEEP_BYTES = 1 << 30


def keep_freed_memory(limit: int = KEEP_BYTES) -> bool:
    """Serve requests up to ``limit`` bytes from the heap and keep up to
    ``limit`` bytes of its free top (glibc's ``M_MMAP_THRESHOLD`` and
    ``M_TRIM_THRESHOLD``, which also stops the mmap threshold's dynamic
    adjustment), for the whole process.

    Args:
        limit: bytes, ``1 <= limit < 2**31`` (``mallopt`` takes an ``int``).
    Returns:
        Whether both were set: False without glibc (another C library).
    Raises:
        ValueError: ``limit`` outside that range.
    """
    if not 1 <= limit < 1 << 31:
        raise ValueError(f"heap threshold of {limit} bytes (1 to 2**31 - 1)")
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    mallopt = getattr(ctypes.CDLL(name), "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, limit)) and bool(mallopt(M_TRIM_THRESHOLD, limit))
