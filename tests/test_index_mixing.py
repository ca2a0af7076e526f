"""Mixing: exact, prefix-stable interleaving of tasks; lag bounds checked at every prefix."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskdata.index import Mixing, PlanError
from tests.index_references import range_task_positions

# Very unequal weights on purpose: 999:1 is the brief's 0.999/0.001.
weight = st.one_of(st.integers(1, 20), st.sampled_from([1, 999, 1000, 10**6, 10**12]), st.integers(1, 10**9))


def lags(mixing: Mixing, n: int) -> list[Fraction]:
    total = sum(mixing.weights)
    return [Fraction(c * total - n * w, total) for c, w in zip(mixing.counts(n), mixing.weights, strict=True)]


def walk(mixing: Mixing, length: int) -> list[tuple[int, int]]:
    """Checks, position by position, that counts grow by exactly the task ``locate`` names."""
    tally = [0] * mixing.num_tasks
    out = []
    for n in range(length):
        assert list(mixing.counts(n)) == tally
        task, task_position = mixing.locate(n)
        assert task_position == tally[task]
        assert mixing.position_of(task, task_position) == n
        tally[task] += 1
        out.append((task, task_position))
    return out


@given(weights=st.lists(weight, min_size=2, max_size=4))
@settings(max_examples=120, deadline=None)
def test_up_to_four_tasks_stay_within_one_example_at_every_prefix(weights: list[int]) -> None:
    mixing = Mixing.from_rates(weights)
    assert all(bound < 1 for bound in mixing.lag_bounds())
    walk(mixing, 600)
    for n in [*range(600), 10**9 + 7, 10**15 + 3, 123_456_789_012]:
        assert all(abs(lag) < 1 for lag in lags(mixing, n))


@given(weights=st.lists(weight, min_size=1, max_size=14))
@settings(max_examples=80, deadline=None)
def test_every_task_stays_within_its_exact_bound_at_every_prefix(weights: list[int]) -> None:
    mixing = Mixing.from_rates(weights)
    bounds = mixing.lag_bounds()
    walk(mixing, 400)
    for n in [*range(400), 10**9 + 7, 10**15 + 3]:
        assert all(abs(lag) <= bound for lag, bound in zip(lags(mixing, n), bounds, strict=True))


def test_lags_are_checked_exhaustively_over_whole_periods() -> None:
    # Rational rates make the sequence periodic with period W = sum(weights): one period is everything.
    for weights in ([999, 1], [1, 2, 3], [5, 3, 2, 1, 1], [7, 7, 7, 7, 7, 7, 7], [40, 30, 15, 8, 4, 2, 1]):
        mixing = Mixing.from_rates(weights)
        period = sum(mixing.weights)
        assert mixing.counts(period) == mixing.weights
        worst = [
            max(abs(lag[i]) for lag in (lags(mixing, n) for n in range(period))) for i in range(len(weights))
        ]
        assert all(w <= b for w, b in zip(worst, mixing.lag_bounds(), strict=True))


def test_equal_rates_of_many_tasks_stay_within_one() -> None:
    for k in (5, 8, 12, 16, 32):
        assert max(Mixing.from_rates([1] * k).lag_bounds()) < 1


def test_large_mixture_lookups_invert() -> None:
    mixing = Mixing.from_rates([(i * 7919) % 1000 + 1 for i in range(300)])
    for n in (0, 1, 10**6, 10**12 + 17):
        task, j = mixing.locate(n)
        assert mixing.position_of(task, j) == n
    assert sum(mixing.counts(10**12)) == 10**12


def test_pinned_sequence_for_a_half_third_sixth_mixture() -> None:
    # Rates 1/2, 1/3, 1/6: no three Beatty sequences floor(n*r + o) can partition the stream, yet
    # the tree keeps every task within one example of its share at every prefix.
    mixing = Mixing.from_rates([Fraction(1, 2), Fraction(1, 3), Fraction(1, 6)])
    assert mixing.weights == (3, 2, 1)
    assert [mixing.locate(n)[0] for n in range(12)] == [0, 1, 0, 2, 0, 1, 0, 1, 0, 2, 0, 1]
    assert mixing.lag_bounds() == (Fraction(1, 2), Fraction(5, 6), Fraction(2, 3))


def test_rates_are_normalised_exactly() -> None:
    assert Mixing.from_rates([2, 2]) == Mixing.from_rates([1, 1]) == Mixing((1, 1))
    assert Mixing.from_rates([Fraction(1, 10), Fraction(2, 10), Fraction(7, 10)]).weights == (1, 2, 7)
    assert Mixing.from_rates([Fraction(999, 1000), Fraction(1, 1000)]).rates == (
        Fraction(999, 1000),
        Fraction(1, 1000),
    )


@pytest.mark.parametrize(
    ("rates", "message"),
    [
        ([1, 0], "Mixing rate 1 must be a positive Fraction or int but got 0."),
        ([True], "Mixing rate 0 must be a positive Fraction or int but got True."),
        ([0.5], "Mixing rate 0 must be a positive Fraction or int but got 0.5."),
        ([], "A mixture needs at least one task with a positive rate."),
    ],
)
def test_invalid_rates_are_named(rates: list, message: str) -> None:
    with pytest.raises(PlanError) as raised:
        Mixing.from_rates(rates)
    assert str(raised.value) == message


def test_weights_must_be_in_lowest_terms() -> None:
    with pytest.raises(PlanError, match=r"lowest terms \(gcd 1\) but got \(2, 4\): use Mixing.from_rates"):
        Mixing((2, 4))


@given(
    weights=st.lists(st.integers(1, 40), min_size=1, max_size=5),
    start=st.one_of(st.integers(0, 10**4), st.integers(0, 10**15), st.integers(2**63 - 30_000, 2**63 + 10)),
    length=st.sampled_from([0, 1, 255, 2048, 8191, 8192, 8193, 20_000]),
)
@settings(max_examples=60, deadline=None)
def test_ranges_read_from_the_period_equal_locate(weights: list[int], start: int, length: int) -> None:
    # Small weights: ranges come from one period (short ranges) or by splitting node by node (longer than the
    # kept periods, or ending past 2**63); the positions checked one by one are a sample of the range.
    mixing = Mixing.from_rates(weights)
    tasks = mixing.tasks_in_range(start, start + length)
    assert tasks.dtype == np.int64 and len(tasks) == length
    task_positions = range_task_positions(mixing, start, tasks)
    for i in sorted({0, length // 3, length - 1, *range(0, length, 97)} & set(range(length))):
        assert (int(tasks[i]), task_positions[i]) == mixing.locate(start + i)


@given(weights=st.lists(weight, min_size=1, max_size=4), lap=st.integers(0, 10**12))
@settings(max_examples=100, deadline=None)
def test_the_interleaving_repeats_every_sum_of_weights(weights: list[int], lap: int) -> None:
    # What Mixing._period relies on: position p + W (W = sum of weights) is p's task, w_task examples later.
    mixing = Mixing.from_rates(weights)
    total = sum(mixing.weights)
    for p in (0, 1, total // 2, total - 1):
        task, position = mixing.locate(p)
        assert mixing.locate(p + lap * total) == (task, position + lap * mixing.weights[task])


range_weights = st.one_of(st.integers(1, 20), st.sampled_from([999, 10**6, 10**12, 10**18]), st.integers(1, 10**9))
starts = st.one_of(
    st.integers(0, 10**6),
    st.integers(0, 10**15),
    st.integers(2**62, 2**63 + 2**20),  # int64 positions near their limit, and Python ints past it
)


@given(weights=st.lists(range_weights, min_size=1, max_size=6), start=starts, length=st.integers(0, 400))
@settings(max_examples=200, deadline=None)
def test_the_tasks_of_a_range_and_its_counts_equal_locate(weights: list[int], start: int, length: int) -> None:
    mixing = Mixing.from_rates(weights)
    tasks = mixing.tasks_in_range(start, start + length)
    assert tasks.dtype == np.int64
    got = list(zip(tasks.tolist(), range_task_positions(mixing, start, tasks), strict=True))
    assert got == [mixing.locate(p) for p in range(start, start + length)]


def test_tasks_in_range_checks_its_bounds() -> None:
    with pytest.raises(PlanError, match="A position range must have start <= stop but got start=5, stop=4"):
        Mixing((1, 2)).tasks_in_range(5, 4)
    with pytest.raises(PlanError, match="A stream position must be an integer >= 0 but got -1"):
        Mixing((1, 2)).tasks_in_range(-1, 4)
