"""Specification of the spot-check policy (swarmnode/admit/spotcheck.py). Each test name is a rule."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from swarmnode.admit.spotcheck import (
    SplitMix64,
    SpotCheckConfig,
    SpotChecker,
    TokenRef,
    Verdict,
    judge,
)
from swarmnode.errors import ConfigError

# --- judge ---------------------------------------------------------------------------------------


def test_log_probs_within_tolerance_pass_with_the_largest_deviation_reported() -> None:
    j = judge([-1.0, -2.05, -0.5], [-1.01, -2.0, -0.5], tolerance=0.1)
    assert j.passed and j.worst == 1 and j.n_tokens == 3
    assert j.max_abs_deviation == pytest.approx(0.05)


def test_one_token_beyond_tolerance_fails_and_names_it() -> None:
    j = judge([-1.0, -2.0, -0.1], [-1.0, -2.0, -3.0], tolerance=0.1)
    assert not j.passed and j.worst == 2 and j.max_abs_deviation == pytest.approx(2.9)
    assert "token 2" in j.reason and "tolerance 0.1" in j.reason


@pytest.mark.parametrize(
    ("reported", "why"),
    [
        ([-1.0, math.nan], "nan"),
        ([-1.0, -math.inf], "-inf"),
        ([-1.0, 0.5], "> 0"),
        ([-1.0], "1 reported log-probs for 2 tokens"),
    ],
)
def test_impossible_reports_fail_with_infinite_deviation(reported: list[float], why: str) -> None:
    j = judge(reported, [-1.0, -2.0], tolerance=10.0)
    assert not j.passed and j.max_abs_deviation == math.inf and why in j.reason


def test_a_token_our_policy_cannot_produce_fails() -> None:
    assert not judge([-1.0], [-math.inf], tolerance=10.0).passed


def test_nothing_to_compare_passes() -> None:
    assert judge([], [], 0.1).passed


# --- selection -----------------------------------------------------------------------------------


def test_the_first_batches_are_always_checked_then_about_sample_rate_of_them_one_group_each() -> None:
    checker = SpotChecker(SpotCheckConfig(sample_rate=0.1, always_check_first=2, groups_per_check=4, seed=7))
    chosen = [checker.begin_batch("w", 4) for _ in range(2002)]
    assert len(chosen[0]) == 1 and len(chosen[1]) == 1
    assert 140 <= sum(bool(c) for c in chosen[2:]) <= 260  # binomial(2000, 0.1): mean 200, sd ~13
    picked = [i for c in chosen for i in c]
    assert set(picked) == {0, 1, 2, 3}  # any group of the batch may be the one checked
    assert checker.workers()["w"]["checked_batches"] == len(picked)
    assert checker.begin_batch("empty", 0) == ()  # nothing to check in an empty batch


def test_a_larger_batch_gets_a_check_for_each_batchs_worth_of_groups() -> None:
    # Red team (#20): 64 groups in a batch, one checked, let a cheat train 64x as many groups.
    checker = SpotChecker(SpotCheckConfig(sample_rate=1.0, groups_per_check=16, seed=3))
    assert [len(checker.begin_batch("w", n)) for n in (1, 16, 17, 64)] == [1, 1, 2, 4]
    many = checker.begin_batch("w", 64)
    assert len(set(many)) == 4 and list(many) == sorted(many) and all(0 <= i < 64 for i in many)


def test_at_most_k_distinct_tokens_are_chosen_within_the_group() -> None:
    checker = SpotChecker(SpotCheckConfig(max_tokens=5, seed=1))
    request = checker.select("w", "g", [3, 0, 4])
    assert request is not None and len(request.tokens) == 5 and len(set(request.tokens)) == 5
    assert all(t.completion in (0, 2) for t in request.tokens)
    assert all(t.position < (3 if t.completion == 0 else 4) for t in request.tokens)
    assert list(request.tokens) == sorted(request.tokens, key=lambda t: (t.completion, t.position))
    small = SpotChecker(SpotCheckConfig(max_tokens=32)).select("w", "g", [2, 1])
    assert small is not None and small.tokens == (TokenRef(0, 0), TokenRef(0, 1), TokenRef(1, 0))


def test_selection_is_reproducible_from_the_seed() -> None:
    def run(seed: int) -> list[object]:
        checker = SpotChecker(SpotCheckConfig(sample_rate=0.3, seed=seed))
        return [(checker.begin_batch("w", 3), checker.select("w", i, [20, 30])) for i in range(50)]

    assert run(3) == run(3)
    assert run(3) != run(4)


def test_a_group_without_tokens_is_not_checked() -> None:
    assert SpotChecker().select("w", "g", [0, 0]) is None


def test_the_request_names_the_prefix_to_recompute_and_picks_values() -> None:
    checker = SpotChecker(SpotCheckConfig(max_tokens=2, seed=0))
    request = checker.select("w", "g", [4, 6])
    assert request is not None
    rows = [[-0.1, -0.2, -0.3, -0.4], [-1.0, -1.1, -1.2, -1.3, -1.4, -1.5]]
    picked = request.pick(rows)
    assert picked == [rows[t.completion][t.position] for t in request.tokens]
    for c in request.completions:
        assert request.prefix(c) == max(t.position for t in request.tokens if t.completion == c) + 1
    assert all(math.isnan(v) for v in request.pick([]))  # missing reports fail, never pass


def test_a_worker_with_a_strike_is_checked_at_the_suspect_rate() -> None:
    checker = SpotChecker(SpotCheckConfig(sample_rate=0.0, suspect_sample_rate=1.0, always_check_first=0))
    assert all(checker.begin_batch("w", 2) == () for _ in range(20))
    checker.check("w", [-5.0], [-1.0])
    assert all(checker.begin_batch("w", 2) for _ in range(20))
    assert all(checker.begin_batch("other", 2) == () for _ in range(20))


@given(st.integers(0, 2**64 - 1), st.integers(1, 10_000), st.data())
def test_splitmix_samples_are_distinct_and_in_range(seed: int, n: int, data: st.DataObject) -> None:
    k = data.draw(st.integers(0, min(n, 64)))
    sample = SplitMix64(seed).sample(n, k)
    assert len(sample) == k == len(set(sample)) and all(0 <= x < n for x in sample)
    assert sample == sorted(sample)
    assert 0.0 <= SplitMix64(seed).random() < 1.0


# --- strikes and verdicts ------------------------------------------------------------------------


def test_a_misreporting_worker_is_deactivated_after_max_strikes_with_its_score_lowered_each_time() -> None:
    checker = SpotChecker(SpotCheckConfig(max_strikes=3, fail_penalty=10.0, deactivate_penalty=50.0))
    outcomes = [checker.check("liar", [-0.1, -0.1], [-2.0, -3.0]) for _ in range(3)]
    assert [o.verdict for o in outcomes] == [Verdict.OK, Verdict.OK, Verdict.DEACTIVATE]
    assert [o.strikes for o in outcomes] == [1, 2, 0]
    assert [o.score_delta for o in outcomes] == [-10.0, -10.0, -60.0]
    assert "3 spot checks" in outcomes[-1].reason and "deviation" in outcomes[-1].reason
    assert checker.stats.deactivations == 1 and checker.stats.fails == 3


def test_an_honest_worker_passes_without_score_change() -> None:
    checker = SpotChecker()
    outcome = checker.check("honest", [-1.0, -2.0], [-1.0, -2.00001])
    assert outcome.verdict is Verdict.OK and outcome.score_delta == 0.0 and outcome.strikes == 0


def test_a_long_run_of_passes_forgives_one_strike() -> None:
    checker = SpotChecker(SpotCheckConfig(forgive_after=3, max_strikes=2))
    checker.check("w", [-5.0], [-1.0])
    for _ in range(3):
        checker.check("w", [-1.0], [-1.0])
    assert checker.strikes("w") == 0
    assert checker.check("w", [-5.0], [-1.0]).verdict is Verdict.OK  # one strike again, not two


def test_strikes_are_per_worker() -> None:
    checker = SpotChecker(SpotCheckConfig(max_strikes=2))
    checker.check("a", [-5.0], [-1.0])
    assert checker.check("b", [-5.0], [-1.0]).verdict is Verdict.OK
    assert checker.check("a", [-5.0], [-1.0]).verdict is Verdict.DEACTIVATE


def test_worker_memory_is_bounded_and_keeps_the_ones_with_strikes() -> None:
    checker = SpotChecker(SpotCheckConfig(max_workers=3, max_strikes=5))
    checker.check("liar", [-5.0], [-1.0])
    for i in range(10):
        checker.check(f"honest{i}", [-1.0], [-1.0])
    assert checker.strikes("liar") == 1


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("sample_rate", 1.5),
        ("suspect_sample_rate", -0.1),
        ("max_tokens", 0),
        ("max_strikes", 0),
        ("tolerance", math.nan),
        ("fail_penalty", -1.0),
        ("seed", 1.5),
        ("max_workers", 0),
    ],
)
def test_invalid_config_is_refused_with_the_field_named(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=rf"spotcheck.{field}"):
        SpotCheckConfig(**{field: value})  # type: ignore[arg-type]


def test_a_workers_record_says_after_how_many_batches_and_checked_batches_it_was_deactivated() -> None:
    checker = SpotChecker(SpotCheckConfig(sample_rate=0.0, always_check_first=1, max_strikes=1))
    lie = judge([-0.1], [-2.0], 0.1)
    assert checker.begin_batch("w", 4)  # its first batch is always checked
    assert checker.select("w", "g0", [4]) is not None
    checker.record("w", judge([-1.0], [-1.0], 0.1))
    checker.record_tokens("w", checked=16, skipped=1)
    assert all(checker.begin_batch("w", 4) == () for _ in range(3))  # rate 0: none checked
    checker.begin_batch("w", 4)
    outcome = checker.record("w", lie)
    assert outcome.deactivate
    record = checker.workers()["w"]
    assert record["batches"] == 5 and record["checked_batches"] == 1
    assert record["groups"] == 20 and checker.stats.groups_seen == 20  # every group received
    assert record["checks"] == 2 and record["fails"] == 1 and record["convictions"] == 1
    assert record["first_deactivated_after"] == {"batches": 5, "checked_batches": 1}
    assert record["recent_checked_batches"] == [1]  # which of its batches were checked
    assert record["tokens_checked"] == 16 and record["skipped_share"] == 1 / 16
    checker.begin_batch("w", 4)
    checker.record("w", lie)  # a second conviction keeps the first one's figures
    assert checker.workers()["w"]["first_deactivated_after"] == {"batches": 5, "checked_batches": 1}


def test_the_per_worker_table_is_capped_to_the_busiest_workers() -> None:
    checker = SpotChecker(SpotCheckConfig(sample_rate=0.0, always_check_first=0))
    for i in range(10):
        for _ in range(i):
            checker.begin_batch(f"w{i}", 4)
    assert list(checker.workers(limit=3)) == ["w9", "w8", "w7"]
