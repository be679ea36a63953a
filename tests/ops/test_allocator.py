"""glibc's mmap threshold (node.malloc_mmap_threshold_kib): a fresh process serves a 100 KiB malloc
from its heap by default (the threshold starts at 128 KiB) and with its own mapping once the node sets
64 KiB, which is what returns a freed block's memory to the kernel."""

from __future__ import annotations

import subprocess
import sys

import pytest

from swarmnode.errors import ConfigError
from swarmnode.ops.allocator import set_mmap_threshold

PROBE = """
import ctypes, ctypes.util, sys
from swarmnode.ops.allocator import set_mmap_threshold

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
                 "fordblks", "keepcost")]

libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype = ctypes.c_void_p
set_mmap_threshold(int(sys.argv[1]))
before = libc.mallinfo2().hblks
block = libc.malloc(100 * 1024)
print(libc.mallinfo2().hblks - before)
"""


def mapped_blocks_for_a_100_kib_malloc(kib: int) -> int:
    out = subprocess.run([sys.executable, "-c", PROBE, str(kib)], capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


def test_the_threshold_makes_glibc_map_blocks_it_would_keep_in_its_heap() -> None:
    assert mapped_blocks_for_a_100_kib_malloc(0) == 0  # glibc's default: from the heap
    assert mapped_blocks_for_a_100_kib_malloc(64) == 1  # its own mapping, unmapped when freed


@pytest.mark.parametrize("kib", [-1, 32 * 1024 + 1])
def test_a_threshold_glibc_cannot_take_is_refused_naming_the_key(kib: int) -> None:
    with pytest.raises(ConfigError, match=r"node\.malloc_mmap_threshold_kib"):
        set_mmap_threshold(kib)
