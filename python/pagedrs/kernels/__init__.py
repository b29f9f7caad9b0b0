"""Triton kernels of the paged attention backend.

Each wrapper takes the same arguments, in the same order, as its reference in
``pagedrs.attention.torch_ops`` and returns the same shapes and dtypes.
"""

from .copy_blocks import copy_blocks
from .decode_attention import paged_decode_attention
from .prefill_attention import paged_prefill_attention
from .write_kv import write_kv

__all__ = ["copy_blocks", "paged_decode_attention", "paged_prefill_attention", "write_kv"]
