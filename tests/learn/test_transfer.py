"""The transfer rules (learn.transfer) against hand computations."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from swarmnode.learn.transfer import (
    DemoMemory,
    FamilyBaseline,
    anchor_advantages,
    is_demonstration,
    joint_advantages,
    receiver_advantages,
    select_teaching,
    teaching_value,
)


def test_the_family_baseline_is_an_ewma_of_own_round_means_and_zero_for_an_unseen_family() -> None:
    b = FamilyBaseline(alpha=0.5)
    assert b.rate("products") == 0.0
    b.update({"products": [1.0, 0.0, 0.0, 0.0], "chain_sum": []})  # first sample: taken as is
    assert b.rate("products") == 0.25 and b.rate("chain_sum") == 0.0
    b.update({"products": [1.0, 1.0]})
    assert b.rate("products") == pytest.approx(0.5 * 0.25 + 0.5 * 1.0)
    again = FamilyBaseline(alpha=0.5)
    again.load_state_dict(b.state_dict())
    assert again.rate("products") == b.rate("products")
    with pytest.raises(ValueError, match="alpha"):
        FamilyBaseline(alpha=0.0)
    with pytest.raises(ValueError, match="finite"):
        b.update({"x": [float("nan")]})


def test_partial_credit_is_no_success_in_the_baseline_nor_in_a_foreign_completions_advantage() -> None:
    # Red team rt33 F2: reasoning-gym's default scorer gives "130" for 13 a reward of 0.67. As
    # A = R - b_f it was a lesson (+0.6 where we are weak): 59 wrong variants a group took every
    # external slot, and the receivers' own family fell from 0.77 to 0.07.
    assert receiver_advantages([0.67, 1.0, 0.0], 0.05, positive_only=False) == pytest.approx(
        [-0.05, 0.95, -0.05]
    )
    assert teaching_value(receiver_advantages([0.67] * 8, 0.05, positive_only=True)) == 0.0
    b = FamilyBaseline(alpha=1.0)
    b.update({"products": [0.67, 0.5, 1.0, 0.0]})
    assert b.rate("products") == 0.25  # one success in four


def test_a_foreign_success_on_a_family_we_fail_teaches_much_and_on_one_we_master_little() -> None:
    # Receiver solves 10% of family f: a peer's right answer +0.9, its wrong one -0.1.
    assert receiver_advantages([1.0, 0.0], 0.1, positive_only=False) == pytest.approx([0.9, -0.1])
    # Receiver solves 95%: the peer's right answer +0.05, its error -0.95 (protects our skill).
    assert receiver_advantages([1.0, 0.0], 0.95, positive_only=False) == pytest.approx([0.05, -0.95])
    # Positive-only keeps the first half only.
    assert receiver_advantages([1.0, 0.0], 0.95, positive_only=True) == pytest.approx([0.05, 0.0])
    # An all-correct group (SAPO drops it: zero advantage) is a demonstration here.
    assert teaching_value(receiver_advantages([1.0] * 4, 0.25, positive_only=False)) == pytest.approx(3.0)


def test_selection_takes_the_groups_that_teach_most_and_never_one_that_teaches_nothing() -> None:
    rng = random.Random(0)
    picked = select_teaching(
        [("a", 0.5, "p", 1), ("b", 3.0, "p", 2), ("c", 0.0, "p", 3), ("d", 1.0, "p", 4)], 2, rng
    )
    assert picked == ["b", "d"]
    assert select_teaching([("a", 0.5, "p", 1), ("c", 0.0, "p", 2)], 5, rng) == ["a"]
    ties = {
        tuple(select_teaching([(x, 1.0, "p", x) for x in "abcd"], 2, random.Random(s))) for s in range(20)
    }
    assert len(ties) > 1  # ties broken by the rng, not by arrival order
    with pytest.raises(ValueError):
        select_teaching([], -1, rng)


def test_one_sender_takes_at_most_a_fair_share_of_the_places_while_others_have_lessons() -> None:
    # Red team rt33 F1: ranked by value alone, one peer's groups took all J places, the honest
    # peers' none. Each sender with a lesson gets ceil(J / senders) places; the rest go by value.
    rng = random.Random(0)
    loud = [(f"m{i}", 8.0, "mallory", f"pm{i}") for i in range(8)]
    honest = [("h1", 1.0, "honest", "ph1"), ("h2", 0.5, "honest", "ph2"), ("h3", 0.0, "honest", "ph3")]
    picked = select_teaching([*loud, *honest], 4, rng)
    assert sum(p.startswith("m") for p in picked) == 2 and {"h1", "h2"} <= set(picked)
    # What no one else fills is filled by value.
    assert sum(p.startswith("m") for p in select_teaching([*loud, ("h1", 1.0, "honest", "ph1")], 4, rng)) == 3
    # A prompt teaches once, whoever sends it: ten sybils' near-copies of one group take one place.
    copies = [(f"s{i}", 8.0, f"sybil{i}", "same") for i in range(10)]
    picked = select_teaching([*copies, *honest], 3, rng)
    assert sum(p.startswith("s") for p in picked) == 1 and {"h1", "h2"} <= set(picked)


def test_joint_advantages_normalise_over_every_group_of_a_prompt() -> None:
    # Ours on prompt p: all wrong (GRPO: 0). The peer's on p: all right. Jointly: mean 0.5,
    # unbiased std of [0,0,1,1] = sqrt(1/3): ours -0.866, the peer's +0.866.
    out = joint_advantages([[0.0, 0.0], [1.0, 1.0], [1.0, 0.0]], ["p", "p", "q"], eps=0.0)
    s = (1 / 3) ** 0.5
    assert out[0] == pytest.approx([-0.5 / s] * 2)
    assert out[1] == pytest.approx([0.5 / s] * 2)
    assert out[2] == pytest.approx([0.5 / 0.5**0.5, -0.5 / 0.5**0.5])  # prompt q alone: plain GRPO
    assert joint_advantages([[1.0], [1.0]], ["p", "p"]) == [[0.0], [0.0]]  # all equal: no signal
    with pytest.raises(ValueError):
        joint_advantages([[1.0]], ["p", "q"])


def test_an_own_demonstration_is_an_all_correct_group_and_is_replayed_with_advantage_r() -> None:
    assert is_demonstration([1.0, 1.0, 1.0]) and not is_demonstration([1.0, 0.0]) and not is_demonstration([])
    # GRPO gives it 0 and receiver_baseline R - b_f = 0.03 where we solve 97%; the anchor gives R.
    assert anchor_advantages([1.0, 1.0]) == [1.0, 1.0]


# -- replay: the demonstration memory ------------------------------------------------------------


def test_the_demo_memory_keeps_each_senders_first_answer_and_a_full_family_drops_the_top_owners_oldest() -> (
    None
):
    memory: DemoMemory[str] = DemoMemory(per_family=3, answers_per_prompt=2)
    memory.add("p1 mallory", "add", "p1", "mallory")
    # Red team rt50 F1: replaced by the newest answer, one identity re-answering every prompt
    # honest peers answered took the memory over. A sender's first answer to a prompt stays.
    memory.add("p1 mallory again", "add", "p1", "mallory")
    # Red team rt51 F1: kept first per prompt, an identity answering every prompt before anyone
    # else held the whole memory. Other senders' answers are kept beside it.
    memory.add("p1 alice", "add", "p1", "alice")
    memory.add("p1 bob", "add", "p1", "bob")  # the prompt has its 2 answers
    assert memory.families() == {"add": 1} and memory.senders("add") == {"mallory": 1, "alice": 1}
    assert memory.shares("add") == {"mallory": 0.5, "alice": 0.5}
    memory.add("p2", "add", "p2", "mallory")
    memory.add("p3", "add", "p3", "mallory")  # full: 3 prompts; mallory owns 2.5, alice 0.5
    memory.add("p4", "add", "p4", "alice")  # mallory drops p1 (alice keeps it), then p2
    assert memory.shares("add") == {"alice": 2.0, "mallory": 1.0} and memory.families() == {"add": 3}
    memory.add("m1", "mul", "m1", "mallory")  # another family has room of its own
    every = {item for item, _ in memory.sample(10, {"add": 1.0, "mul": 1.0}, random.Random(0))}
    assert every == {"p1 alice", "p3", "p4", "m1"}
    with pytest.raises(ValueError, match="per_family"):
        DemoMemory(per_family=0)
    with pytest.raises(ValueError, match="answers_per_prompt"):
        DemoMemory(per_family=1, answers_per_prompt=0)


def test_an_identity_answering_every_prompt_first_gets_one_senders_share_of_the_rows() -> None:
    # Red team rt51 F1: a round's prompts follow from the public seed, so one identity can answer
    # each before the honest peers do; kept first per prompt, it held 256 of 256 entries and every
    # draw. The honest answers to the same prompts are kept too, and given as many rows.
    memory: DemoMemory[str] = DemoMemory(per_family=256)
    for i in range(128):
        memory.add("m", "add", i, "mallory")
        memory.add("h", "add", i, "honest")
    for seed in range(5):
        drawn = Counter(item for item, _ in memory.sample(64, {"add": 1.0}, random.Random(seed)))
        assert drawn == {"m": 32, "h": 32}


def honest_and_mallory(memory: DemoMemory[str], honest: int, rounds: int, mallory_prompts: int) -> None:
    """``honest`` peers answer the same 8 prompts a round; mallory answers prompts of her own."""
    for r in range(rounds):
        for p in range(8):
            for h in range(honest):
                memory.add(f"h{h}", "add", (r, p), f"honest{h}")
        for p in range(mallory_prompts):
            memory.add("m", "add", ("mallory", r, p), "mallory")


@pytest.mark.parametrize(("honest", "mallory_prompts"), [(1, 8), (7, 8), (7, 32), (15, 8)])
def test_an_identity_gets_one_senders_share_of_the_rows_however_distinctly_it_answers(
    honest: int, mallory_prompts: int
) -> None:
    # Red team rt52 F1: kept per (prompt, sender), mallory's distinct prompts took 34-40% of the
    # rows while the honest peers answered the same ones. Owned by share, her distinct prompts
    # cost her what all answerers of a shared one pay together, and the round robin gives her
    # one sender's rows.
    memory: DemoMemory[str] = DemoMemory(per_family=256)
    honest_and_mallory(memory, honest, 60, mallory_prompts)
    assert memory.families() == {"add": 256}
    senders = min(honest, 7) + 1  # 8 answers a prompt at most
    # Her part of the memory is one sender's, so the honest prompts keep the rest of it.
    assert memory.shares("add")["mallory"] <= 256 / senders + 1
    for seed in range(5):
        drawn = [item for item, _ in memory.sample(64, {"add": 1.0}, random.Random(seed))]
        assert len(drawn) == 64
        assert drawn.count("m") <= math.ceil(64 / senders) + 1


def test_a_young_memory_gives_an_identity_one_senders_rows_too() -> None:
    # Red team rt54 F1: seven honest peers answer the same 8 prompts, mallory 8 of her own. The
    # honest senders' turns ended with their undrawn prompts, and she took the other 8 of 16
    # rows. A sender keeps its turns with its answer to a prompt drawn for another.
    memory: DemoMemory[str] = DemoMemory(per_family=256)
    for p in range(8):
        for h in range(7):
            memory.add("h", "add", p, f"honest{h}")
        memory.add("m", "add", ("mallory", p), "mallory")
    for seed in range(5):
        drawn = Counter(item for item, _ in memory.sample(64, {"add": 1.0}, random.Random(seed)))
        assert drawn == {"h": 56, "m": 8}  # every answer once: 7 honest senders and mallory


def test_an_identity_adding_its_answer_to_every_prompt_gets_one_senders_rows() -> None:
    # Red team rt54 F2: each honest sender answers prompts of its own, and mallory adds her answer
    # to every one, owning half of each: she stores about twice an honest sender's answers (open,
    # low), but the round robin gives her one sender's rows.
    memory: DemoMemory[str] = DemoMemory(per_family=256)
    for r in range(60):
        for h in range(8):
            for p in range(8):
                memory.add("h", "add", (r, h, p), f"honest{h}")
                memory.add("m", "add", (r, h, p), "mallory")
    for seed in range(5):
        drawn = Counter(item for item, _ in memory.sample(64, {"add": 1.0}, random.Random(seed)))
        assert drawn["m"] <= 8 and sum(drawn.values()) == 64


def test_an_identity_answering_every_family_gets_one_senders_rows_in_all() -> None:
    # Red team rt55 N1: fair within each family, an identity answering all four families of a
    # swarm of specialists got a share in each: 32 of 64 rows, 3x any teacher's. A sender in m of
    # the families drawn has 1/m of a turn in each.
    memory: DemoMemory[str] = DemoMemory(per_family=256)
    for r in range(40):
        for f in range(4):
            for p in range(8):
                memory.add("local" if f == 0 else f"p{f}", f"f{f}", (r, p), "local" if f == 0 else f"p{f}")
                memory.add("a", f"f{f}", (r, p), "mallory")
    weights = {"f0": 0.1, "f1": 0.9, "f2": 0.9, "f3": 0.9}
    drawn = Counter(item for s in range(20) for item, _ in memory.sample(64, weights, random.Random(s)))
    assert drawn["a"] / 20 < 16  # 64 rows, 5 senders: 12.8 each (before: 32)
    assert all(drawn[p] / 20 > 14 for p in ("p1", "p2", "p3"))  # (before: 10.1-10.6)


def test_an_identity_answering_only_the_heaviest_family_gets_one_senders_rows() -> None:
    # Red team rt56 F1: with 1/m of a turn per family, seven honest senders answering all four
    # families had 1/4 of a turn in the heaviest (the one we are weakest on), and mallory,
    # answering only it, a whole one: 18.7 rows against a fair 8. A turn is now the family's
    # part of the rows of the families a sender answers.
    memory: DemoMemory[str] = DemoMemory(per_family=256)
    for f in range(4):
        for p in range(64):
            for h in range(7):
                memory.add("h", f"f{f}", p, f"honest{h}")
            if f == 0:
                memory.add("m", "f0", ("mallory", p), "mallory")
    weights = {"f0": 0.9, "f1": 0.1, "f2": 0.1, "f3": 0.1}
    drawn = Counter(item for s in range(20) for item, _ in memory.sample(64, weights, random.Random(s)))
    assert drawn["m"] / 20 < 10  # 64 rows, 8 senders: 8 each


def test_rows_a_family_cannot_fill_stay_empty_and_do_not_spill_into_a_mastered_one() -> None:
    # Red team rt55 N2: a family of weight 1 with 4 prompts got 4 rows and one of weight 0.01 the
    # other 60, each with A = 0.01, diluting the useful rows. A family now gets the rows its
    # weight gives it, up to its answers, and the rest stay empty.
    memory: DemoMemory[str] = DemoMemory(per_family=256)
    for p in range(4):
        for h in range(3):
            memory.add("need", "need", p, f"honest{h}")
    for p in range(256):
        memory.add("solved", "solved", p, "mallory")
    for seed in range(5):
        drawn = Counter(f for _, f in memory.sample(64, {"need": 1.0, "solved": 0.01}, random.Random(seed)))
        assert drawn["need"] == 12 and drawn["solved"] <= 4  # every answer of "need" once


def test_a_familys_one_teacher_fills_its_rows_beside_senders_of_one_answer() -> None:
    # Red team rt53 F1: with a quota of ceil(K / peers), one identity holding one answer halved
    # the rows a family's one teacher gave. The round robin lets the teacher fill them.
    memory: DemoMemory[str] = DemoMemory(per_family=256)
    for p in range(256):
        memory.add("t", "dec", p, "teacher")
    for p, who in enumerate(["once", "local", "local", "local", "local"]):
        memory.add(who, "dec", 1000 + p, who)
    drawn = Counter(item for item, _ in memory.sample(64, {"dec": 1.0}, random.Random(0)))
    assert drawn == {"t": 59, "once": 1, "local": 4}


def test_rows_follow_the_family_weights_whoever_answers_the_other_families() -> None:
    # Red team rt53 F2: a quota counted across families let peers of a mastered family (weight
    # 0.05) shrink the one teacher's rows of the family we lack (weight 1) to 8 of 64.
    memory: DemoMemory[str] = DemoMemory(per_family=256)
    for p in range(100):
        memory.add("b", "b", p, "teacher")
        for peer in range(7):
            memory.add("a", "a", p, f"peer{peer}")
    counts = Counter(
        f for s in range(20) for _, f in memory.sample(64, {"a": 0.05, "b": 1.0}, random.Random(s))
    )
    assert 0.9 < counts["b"] / (20 * 64) < 0.99  # 1 / 1.05 = 0.95


def test_the_demo_memory_draws_distinct_prompts_by_family_weight_and_never_from_a_weight_of_zero() -> None:
    memory: DemoMemory[int] = DemoMemory(per_family=1000)
    for i in range(400):
        memory.add(i, "weak", ("w", i), "s")
        memory.add(1000 + i, "strong", ("s", i), "s")
        memory.add(2000 + i, "mastered", ("m", i), "s")
    drawn = memory.sample(200, {"weak": 0.9, "strong": 0.3, "mastered": 0.0}, random.Random(1))
    items = [item for item, _ in drawn]
    assert len(items) == len(set(items)) == 200  # distinct
    families = Counter(family for _, family in drawn)
    assert families["mastered"] == 0 and "unknown" not in families
    assert 2.0 < families["weak"] / families["strong"] < 4.5  # 3:1 by weight
    # Fewer prompts than asked: every prompt of the families with weight, once.
    assert len(memory.sample(2000, {"weak": 1.0, "strong": 1.0}, random.Random(2))) == 800
    assert memory.sample(5, {}, random.Random(3)) == []
    # Shares add up to the prompts, however they are split.
    shared: DemoMemory[str] = DemoMemory(per_family=8)
    honest_and_mallory(shared, 3, 5, 2)
    assert sum(shared.shares("add").values()) == pytest.approx(8)


def test_the_nodes_own_answers_in_every_family_get_their_rows_beside_one_specialist_in_each() -> None:
    # Red team rt57 F1: every sample started each sender's credit at 0, so a sender answering all
    # 16 families (the node itself, 1/16 of a turn in each) rarely reached a row in a family of ~4
    # rows: 0.6 rows a sample against 3.7 for each specialist. A part-timer's credit starts at a
    # random phase, so it gives its part of a turn in expectation.
    families = [f"f{i}" for i in range(16)]
    memory: DemoMemory[str] = DemoMemory(per_family=256)
    rng = random.Random(0)
    drawn: Counter[str] = Counter()
    samples = 0
    for r in range(80):
        if r >= 40:
            drawn.update(item for item, _ in memory.sample(64, dict.fromkeys(families, 1.0), rng))
            samples += 1
        for i, family in enumerate(families):
            for p in range(2):
                memory.add(f"s{i}", family, (family, "s", r, p), f"specialist{i}")
                memory.add("local", family, (family, "local", r, p), "local")
    specialist = sum(drawn[f"s{i}"] for i in range(16)) / 16 / samples
    assert drawn["local"] / samples > 0.75 * specialist  # 17 senders of 64 rows: 3.8 each


def test_a_specialists_lucky_answers_elsewhere_cost_it_no_turn_at_home() -> None:
    # Red team rt57 F2: a sender's load counted the whole rows of every family it had an answer
    # in, so a specialist with one lucky answer in each other family had about 1/4 of a turn at
    # home, where an identity answering only that family kept a whole one (1.9 rows against 9.6).
    # A sender's part of a family is the rows it can give there, at most its answers.
    families = [f"f{i}" for i in range(4)]
    memory: DemoMemory[str] = DemoMemory(per_family=256)
    rng = random.Random(0)
    home: Counter[str] = Counter()
    for r in range(120):
        if r >= 60:
            home.update(
                item
                for item, family in memory.sample(64, dict.fromkeys(families, 1.0), rng)
                if family == "f0"
            )
        for i, family in enumerate(families):
            for p in range(2):
                memory.add(f"s{i}", family, (family, i, r, p), f"specialist{i}")
                memory.add("local", family, (family, i, r, p), "local")
            if r == 0:
                for other in families:
                    if other != family:
                        memory.add(f"s{i}", other, (other, "luck", i), f"specialist{i}")
        for p in range(2):
            memory.add("m", "f0", ("f0", "mallory", r, p), "mallory")
    assert home["s0"] > 0.6 * home["m"]  # the same 2 prompts a round each


def test_an_identity_answering_every_family_gets_one_specialists_rows_when_no_one_has_a_whole_turn() -> None:
    # Red team rt58 F1: a specialist with one stray answer in another family has less than a
    # whole turn at home; with no whole turn in a family the round robin ignored the turns, and an
    # identity answering every family gave as many rows as each specialist, in every family: 3.5x
    # a specialist's rows. Turns are now measured against the largest one with answers left.
    families = [f"f{i}" for i in range(4)]
    memory: DemoMemory[tuple[str, int]] = DemoMemory(per_family=256)
    for i, family in enumerate(families):
        for p in range(40):
            memory.add((f"s{i}", p), family, (family, "s", p), f"specialist{i}")
            memory.add(("m", p), family, (family, "m", p), "mallory")
        memory.add((f"s{i}", -1), families[(i + 1) % 4], ("stray", i), f"specialist{i}")
    rng = random.Random(0)
    rows = Counter(
        who for _ in range(200) for (who, _), _ in memory.sample(64, dict.fromkeys(families, 1.0), rng)
    )
    specialist = sum(rows[f"s{i}"] for i in range(4)) / 4
    assert rows["m"] < 1.3 * specialist, (rows["m"], specialist)
