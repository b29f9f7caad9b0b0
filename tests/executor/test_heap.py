"""``executor.heap``: after ``keep_freed_memory`` the buffers of repeated
steps reuse freed heap pages instead of being faulted in again (minor page
faults counted by ``getrusage``, in a fresh process so the test process's
heap is left as it is). torch asks for 64-byte aligned memory, which glibc
serves from a free chunk only with room for the alignment, so the first few
rounds may still grow the heap; after them the rounds fault in nothing."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from pagedrs.executor.heap import keep_freed_memory

_FAULTS = """
import json, resource, sys
import torch
from pagedrs.executor.heap import keep_freed_memory

SIZE = 64 << 20  # above glibc's largest dynamic mmap threshold (32 MiB)

def round_faults():
    # page faults of filling a fresh buffer after freeing one of its size
    a = torch.empty(SIZE, dtype=torch.uint8)
    a.fill_(1)
    del a
    b = torch.empty(SIZE, dtype=torch.uint8)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    b.fill_(1)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

plain = [round_faults() for _ in range(3)]
kept = keep_freed_memory()
reused = [round_faults() for _ in range(8)]
print(json.dumps({"plain": plain, "kept": kept, "reused": reused}))
"""


def test_freed_buffers_are_reused_without_page_faults() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _FAULTS], check=True, capture_output=True, text=True
    ).stdout
    res = json.loads(out.strip().splitlines()[-1])
    if not res["kept"]:
        pytest.skip("the C library is not glibc (no mallopt)")
    pages = (64 << 20) // 4096
    assert min(res["plain"]) > pages // 2  # a fresh mmap each round: every page
    assert max(res["reused"][-3:]) < pages // 100  # freed heap memory, mapped


@pytest.mark.parametrize("limit", [0, 1 << 31])
def test_limit_outside_the_int_range(limit: int) -> None:
    with pytest.raises(ValueError, match="heap threshold"):
        keep_freed_memory(limit)
