"""aggregate(): the four verl aggregation modes, worked by hand on a 2 x 3 batch."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from swarmnode.learn import AGG_MODES, aggregate

VALUES = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])  # lengths 2 and 1


def test_token_mean_divides_by_all_unmasked_tokens() -> None:
    # (1 + 2 + 4) / 3
    assert aggregate(VALUES, MASK, "token-mean").item() == pytest.approx(7 / 3)


def test_seq_mean_token_mean_averages_each_sequence_then_the_batch() -> None:
    # ((1 + 2) / 2 + 4 / 1) / 2 = (1.5 + 4) / 2
    assert aggregate(VALUES, MASK, "seq-mean-token-mean").item() == pytest.approx(2.75)


def test_seq_mean_token_sum_sums_each_sequence_then_averages() -> None:
    # ((1 + 2) + 4) / 2
    assert aggregate(VALUES, MASK, "seq-mean-token-sum").item() == pytest.approx(3.5)


def test_seq_mean_token_sum_norm_divides_by_batch_times_constant_length() -> None:
    # (3 + 4) / (B=2 * T=3); with norm_len=7: 7 / 14 (TRL dr_grpo: B * max_completion_length)
    assert aggregate(VALUES, MASK, "seq-mean-token-sum-norm").item() == pytest.approx(7 / 6)
    assert aggregate(VALUES, MASK, "seq-mean-token-sum-norm", norm_len=7).item() == pytest.approx(0.5)


def test_an_empty_sequence_counts_as_zero_not_nan() -> None:
    values = torch.tensor([[1.0, 1.0], [5.0, 5.0]])
    mask = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    # (1 + 0) / 2: the empty row is a zero in the batch mean (TRL's clamp(min=1))
    assert aggregate(values, mask, "seq-mean-token-mean").item() == pytest.approx(0.5)
    assert aggregate(values, mask, "token-mean").item() == pytest.approx(1.0)


def test_padding_values_never_leak_into_the_result() -> None:
    poisoned = VALUES.clone()
    poisoned[MASK == 0] = 1e6
    for mode in AGG_MODES:
        assert aggregate(poisoned, MASK, mode).item() == pytest.approx(aggregate(VALUES, MASK, mode).item())  # type: ignore[arg-type]


def test_bad_mode_shape_and_norm_len_are_rejected() -> None:
    with pytest.raises(ValueError, match="unknown aggregation mode"):
        aggregate(VALUES, MASK, "sum")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"\(B, T\)"):
        aggregate(VALUES, MASK[:, :2], "token-mean")
    with pytest.raises(ValueError, match="norm_len"):
        aggregate(VALUES, MASK, "token-mean", norm_len=4)


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(min_value=1, max_value=5), min_size=1, max_size=4),
    c=st.floats(min_value=-10, max_value=10),
)
def test_a_constant_is_its_own_mean_under_both_mean_modes(lengths: list[int], c: float) -> None:
    mask = torch.tensor([[1.0] * n + [0.0] * (5 - n) for n in lengths], dtype=torch.float64)
    values = torch.full_like(mask, c)
    assert aggregate(values, mask, "token-mean").item() == pytest.approx(c)
    assert aggregate(values, mask, "seq-mean-token-mean").item() == pytest.approx(c)
    # token sums: mean length * c; the norm mode divides the same sums by T = 5
    mean_len = sum(lengths) / len(lengths)
    assert aggregate(values, mask, "seq-mean-token-sum").item() == pytest.approx(mean_len * c)
    assert aggregate(values, mask, "seq-mean-token-sum-norm").item() == pytest.approx(mean_len * c / 5)
