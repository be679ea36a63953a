"""The C allocator's one setting a training node may want: glibc's mmap threshold.

Owns: ``set_mmap_threshold`` (``node.malloc_mmap_threshold_kib``) and reading what it did.
Must not: choose the value (config) or touch torch's own caching.

Why: CPU torch allocates tensors with ``malloc``. glibc serves a block under its mmap threshold from
its heaps and keeps it there once freed, for reuse; the threshold starts at 128 KiB and rises with
every larger block freed, up to 32 MiB. An update that allocates and frees thousands of blocks of
different sizes (micro-batches, checkpointed layers recomputed, the LM head a chunk at a time)
leaves most of its peak in glibc's heaps as freed but resident memory: at Qwen2.5-0.5B's shape a
LoRA update's peak RSS was 7.54 GiB, 2.89 GiB with a fixed 64 KiB threshold (every larger block
mapped on its own and returned to the kernel when freed), at the price of page faults on every
such allocation (``bench/memory.py``; the README's memory table). ``mallopt(M_MMAP_THRESHOLD)``
is the run-time form of glibc's ``MALLOC_MMAP_THRESHOLD_`` environment variable, and like it fixes
the threshold (no more rising).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

from swarmnode.errors import ConfigError

log = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3  # glibc's malloc.h
#: glibc refuses thresholds above HEAP_MAX_SIZE / 2 (32 MiB on 64-bit).
MAX_MMAP_THRESHOLD_KIB = 32 * 1024


def _glibc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    libc = ctypes.CDLL(name)
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "gnu_get_libc_version") else None


def set_mmap_threshold(kib: int) -> bool:
    """Serve every ``malloc`` of ``kib`` KiB or more with its own mapping, returned to the kernel
    when freed. 0: leave glibc's default. False (with a warning) where the C library is not glibc."""
    if kib == 0:
        return False
    if not 0 < kib <= MAX_MMAP_THRESHOLD_KIB:
        raise ConfigError(f"node.malloc_mmap_threshold_kib={kib}: must be 0 or 1..{MAX_MMAP_THRESHOLD_KIB}")
    libc = _glibc()
    if libc is None:
        log.warning("node.malloc_mmap_threshold_kib is ignored: this C library is not glibc")
        return False
    if not libc.mallopt(M_MMAP_THRESHOLD, ctypes.c_int(kib * 1024)):
        raise ConfigError(f"node.malloc_mmap_threshold_kib={kib}: glibc's mallopt refused it")
    return True


__all__ = ["MAX_MMAP_THRESHOLD_KIB", "set_mmap_threshold"]
