"""Swarm rounds as wall-clock epochs.

Owns: the mapping between a time and a swarm round. Round ``r`` is the half-open interval
``[epoch + r * round_seconds, epoch + (r + 1) * round_seconds)``. Every node computes its round
from the clock, never from a counter it increments, so a node that joins late (or restarts, or
sleeps through a round) lands in the same round as everyone else.

Must not: read a clock. Callers pass ``now`` (the node passes wall-clock time, the simulator its
virtual clock); nodes must agree on ``epoch`` and ``round_seconds`` (swarm configuration).
"""

from __future__ import annotations

import math


def _check(round_seconds: float, *times: float) -> None:
    if not (round_seconds > 0 and math.isfinite(round_seconds)):
        raise ValueError(f"round_seconds must be a positive finite number, got {round_seconds!r}")
    for t in times:
        if not math.isfinite(t):
            raise ValueError(f"time must be finite, got {t!r}")


def round_start(round_index: int, round_seconds: float, epoch: float = 0.0) -> float:
    """The time at which round ``round_index`` begins."""
    _check(round_seconds, epoch)
    return epoch + round_index * round_seconds


def round_at(now: float, round_seconds: float, epoch: float = 0.0) -> int:
    """The swarm round at time ``now``: ``floor((now - epoch) / round_seconds)``.

    Exact at boundaries: ``round_start(r) <= now < round_start(r + 1)`` always holds for the
    returned ``r`` (plain float division can land one round off right at a boundary).
    """
    _check(round_seconds, now, epoch)
    r = math.floor((now - epoch) / round_seconds)
    while round_start(r + 1, round_seconds, epoch) <= now:
        r += 1
    while round_start(r, round_seconds, epoch) > now:
        r -= 1
    return r
