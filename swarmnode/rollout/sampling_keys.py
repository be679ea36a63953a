"""The keyed sampling rule's uniforms (protocol/SPEC.md 1.8): a function of a learner's seed, the
task key, the completion index and the position. ``rollout.keyed`` chooses and checks tokens with
them; this module is apart so that ``rollout.types`` can name ``SamplingKeys`` without a cycle.

Must not: touch logits.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import torch

DOMAIN = b"swarmnode/keyed-sampling/v1\x00"
SEED_BYTES = 32


def _row_hash(seed: bytes, key: str, completion: int) -> hashlib._Hash:
    """SHA-256 fed with everything before the position (one per completion, copied per token)."""
    if len(seed) != SEED_BYTES:
        raise ValueError(f"a sampling seed is {SEED_BYTES} bytes, got {len(seed)}")
    if not 0 <= completion < 2**32:
        raise ValueError(f"completion must be u32, got {completion}")
    k = key.encode("utf-8")
    return hashlib.sha256(DOMAIN + seed + struct.pack(">I", len(k)) + k + struct.pack(">I", completion))


def _uniform_at(row: hashlib._Hash, position: int) -> float:
    if not 0 <= position < 2**32:
        raise ValueError(f"position must be u32, got {position}")
    h = row.copy()
    h.update(struct.pack(">I", position))
    return ((int.from_bytes(h.digest()[:8], "big") >> 11) + 1) / 2**53


def keyed_uniform(seed: bytes, key: str, completion: int, position: int) -> float:
    """The rule's uniform in (0, 1] for one draw (exactly representable: 53 bits)."""
    return _uniform_at(_row_hash(seed, key, completion), position)


@dataclass(frozen=True)
class SamplingKeys:
    """What keys a ``generate`` call: the seed and each prompt's task key (row ``p * n + j`` is
    completion ``j`` of prompt ``p``)."""

    seed: bytes
    task_keys: tuple[str, ...]

    def __post_init__(self) -> None:
        if len(self.seed) != SEED_BYTES:
            raise ValueError(f"a sampling seed is {SEED_BYTES} bytes, got {len(self.seed)}")

    def uniforms(self, n: int, position: int, rows: Sequence[int]) -> torch.Tensor:
        """(len(rows),) float64 uniforms of batch rows ``rows`` at ``position``."""
        cache = self._rows()
        out = []
        for r in rows:
            prompt, completion = divmod(r, n)
            row = cache.get((prompt, completion))
            if row is None:
                row = cache[(prompt, completion)] = _row_hash(self.seed, self.task_keys[prompt], completion)
            out.append(_uniform_at(row, position))
        return torch.tensor(out, dtype=torch.float64)

    def _rows(self) -> dict[tuple[int, int], hashlib._Hash]:
        # Each (prompt, completion)'s hash of everything before the position, made once and copied
        # per token (kept outside the frozen fields).
        cache: dict[tuple[int, int], hashlib._Hash] | None = self.__dict__.get("_row_cache")
        if cache is None:
            cache = {}
            object.__setattr__(self, "_row_cache", cache)
        return cache
