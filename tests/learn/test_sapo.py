"""select_groups(): SAPO's I local + J external groups, zero-advantage groups dropped, uniform sampling
(external groups fairly over their senders)."""

import random
from collections import Counter
from dataclasses import dataclass

import pytest

from swarmnode.learn import fair_sample, has_signal, select_groups


@dataclass(frozen=True)
class Group:
    name: str
    rewards: tuple[float, ...]


LOCAL = [
    Group("l0", (1, 0)),
    Group("l1", (0, 0)),
    Group("l2", (0.5, 0.5)),
    Group("l3", (0, 1)),
    Group("l4", (1, 0.01)),
]
EXTERNAL = [Group(f"e{i}", (1, 1)) for i in range(3)] + [Group(f"x{i}", (0, 1, 1)) for i in range(4)]


def test_a_group_has_signal_iff_its_rewards_differ() -> None:
    assert [has_signal(g) for g in LOCAL] == [True, False, False, True, True]


def test_selection_takes_i_local_and_j_external_groups_with_signal() -> None:
    local, external = select_groups(LOCAL, EXTERNAL, 2, 3, random.Random(0))
    assert len(local) == 2 and len(external) == 3
    assert all(has_signal(g) for g in local + external)
    assert len(set(local)) == 2 and len(set(external)) == 3  # no repeats
    assert set(local) <= set(LOCAL) and set(external) <= set(EXTERNAL)


def test_asking_for_more_than_qualify_returns_all_that_qualify_without_backfill() -> None:
    local, external = select_groups(LOCAL, EXTERNAL, 8, 0, random.Random(0))
    assert sorted(g.name for g in local) == ["l0", "l3", "l4"]
    assert external == []


def test_selection_is_deterministic_given_the_rng() -> None:
    assert select_groups(LOCAL, EXTERNAL, 2, 2, random.Random(7)) == select_groups(
        LOCAL, EXTERNAL, 2, 2, random.Random(7)
    )


def test_selection_is_uniform_over_qualifying_groups() -> None:
    rng = random.Random(1)
    counts: Counter[str] = Counter()
    for _ in range(2000):
        _, external = select_groups([], EXTERNAL, 0, 1, rng)
        counts.update(g.name for g in external)
    assert set(counts) == {"x0", "x1", "x2", "x3"}  # the all-equal e* groups never
    assert all(400 < n < 600 for n in counts.values())  # 500 expected each; 5+ sigma margin


def test_external_groups_are_drawn_fairly_over_senders_however_many_one_sends() -> None:
    """Red team rt63 F1: one identity sending 400 groups a round against 7 honest peers' 16 each
    took 78% of the J places under the uniform draw; over senders it gets its eighth."""
    honest = [Group(f"h{p}-{i}", (0, 1)) for p in range(7) for i in range(16)]
    flood = [Group(f"a-{i}", (0, 1)) for i in range(400)]
    rng = random.Random(2)
    taken: Counter[str] = Counter()
    for _ in range(2000):
        _, external = select_groups([], [*honest, *flood], 0, 4, rng, lambda g: g.name.split("-")[0])
        assert len(set(external)) == 4
        taken.update(g.name.split("-")[0] for g in external)
    assert 0.10 < taken["a"] / 8000 < 0.15  # 1/8 expected; 5+ sigma margin
    assert all(0.10 < taken[f"h{p}"] / 8000 < 0.15 for p in range(7))


def test_a_fair_sample_fills_from_the_senders_with_items_left() -> None:
    items = [("a", 0), ("a", 1), ("a", 2), ("b", 0)]
    rng = random.Random(0)
    with_b = 0
    for _ in range(1000):
        picked = fair_sample(items, 3, lambda item: item[0], rng)
        assert len(set(picked)) == 3
        with_b += ("b", 0) in picked
    assert 830 < with_b < 920  # b is drawn unless a wins all three draws: 7/8 = 875 expected
    assert sorted(fair_sample(items, 9, lambda item: item[0], random.Random(1))) == sorted(items)
    assert fair_sample(items, 0, lambda item: item[0], random.Random(1)) == []
    with pytest.raises(ValueError):
        fair_sample(items, -1, lambda item: item[0], random.Random(1))


def test_negative_counts_are_rejected() -> None:
    with pytest.raises(ValueError):
        select_groups(LOCAL, EXTERNAL, -1, 2, random.Random(0))
