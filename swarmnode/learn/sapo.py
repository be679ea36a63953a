"""SAPO (Gensyn, arXiv 2509.08721): choose which local and swarm groups a node trains on this round.

Owns: the selection rule only. Must not: fetch, re-score or re-tokenize groups (the node does that before
calling: every group here already carries rewards from the *local* verifier), or do any I/O.

Rule (SAPO paper, as summarised in ALGORITHMS.md Sec. 2: drop zero-advantage groups, sample uniformly)::

    train set = uniform sample of I local groups  among local groups with a non-zero advantage
              + uniform sample of J external groups among external groups with a non-zero advantage

A group has all-zero advantages exactly when all its rewards are equal, under any advantage scale, so
that is the test (``advantages.zero_advantage``, the project's one definition). Gensyn's released code
(rl-swarm/genrl) keeps the top-scoring groups instead; we follow the paper (ALGORITHMS.md Sec. 2).
Paper setup: I + J = 8, best at I = J = 4. After selection every group gets the same GRPO update, with
no importance correction toward its generator.

One departure, for an open swarm: the J external groups are drawn fairly over their senders
(``fair_sample``: a sender uniformly among those with groups left, then one of its groups
uniformly), not uniformly over groups. In the paper's swarm every node sends the same number of
groups and the two draws are the same; with one identity sending more groups than the others,
the uniform draw gave it its share of the *groups*: 400 a round took 78% of the J places against
7 honest peers' 16 each (red team rt63 F1).

The contract's ``I`` and ``J`` are ``n_local`` and ``n_external`` here (ruff forbids a variable named I).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Hashable, Sequence
from typing import Protocol, TypeVar

from swarmnode.learn.advantages import zero_advantage


class HasRewards(Protocol):
    """Anything with the verifier's rewards of its completions (one prompt, G completions)."""

    @property
    def rewards(self) -> Sequence[float]: ...


GroupT = TypeVar("GroupT", bound=HasRewards)


def has_signal(group: HasRewards) -> bool:
    """True when the group's advantages are not all zero, i.e. its rewards are not all equal."""
    return not zero_advantage(group.rewards)


T = TypeVar("T")


def fair_sample(items: Sequence[T], n: int, sender: Callable[[T], Hashable], rng: random.Random) -> list[T]:
    """Up to ``n`` of ``items``, no repeats: each pick draws a sender uniformly among those with
    items left, then one of its items uniformly. A sender gets no more picks than another while
    that one has items left, however many it sends. Deterministic given ``rng``'s state."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    by_sender: dict[Hashable, list[T]] = {}
    for item in items:
        by_sender.setdefault(sender(item), []).append(item)
    pools = list(by_sender.values())
    picked: list[T] = []
    while pools and len(picked) < n:
        k = rng.randrange(len(pools))
        pool = pools[k]
        picked.append(pool.pop(rng.randrange(len(pool))))
        if not pool:
            pools.pop(k)
    return picked


def select_groups(
    local: Sequence[GroupT],
    external: Sequence[GroupT],
    n_local: int,
    n_external: int,
    rng: random.Random,
    sender: Callable[[GroupT], Hashable] = id,
) -> tuple[list[GroupT], list[GroupT]]:
    """Pick up to ``n_local`` local groups uniformly and ``n_external`` external ones fairly over
    their ``sender`` (``fair_sample``), among those with signal.

    Returns ``(local_picked, external_picked)``; each is shorter than asked when fewer groups qualify (no
    back-filling from the other side, no repeats). Deterministic given ``rng``'s state. The default
    ``sender`` makes each group its own sender: a uniform draw over groups.
    """
    if n_local < 0 or n_external < 0:
        raise ValueError(f"group counts must be >= 0, got n_local={n_local}, n_external={n_external}")
    local_ok = [group for group in local if has_signal(group)]
    external_ok = [group for group in external if has_signal(group)]
    local_picked = rng.sample(local_ok, min(n_local, len(local_ok)))
    external_picked = fair_sample(external_ok, n_external, sender, rng)
    return local_picked, external_picked
