"""Mixing rates are read exactly: the user's numbers, never a binary approximation of them."""

from __future__ import annotations

import decimal
from fractions import Fraction

import numpy as np
import pytest

from taskdata.rates import parse_rate


@pytest.mark.parametrize(
    ("rate", "exact"),
    [
        (3, Fraction(3)),
        (0.1, Fraction(1, 10)),
        (0.7, Fraction(7, 10)),
        (1e-3, Fraction(1, 1000)),
        (Fraction(1, 3), Fraction(1, 3)),
        ("1/3", Fraction(1, 3)),
        ("0.25", Fraction(1, 4)),
        (" 2 ", Fraction(2)),
        (decimal.Decimal("0.1"), Fraction(1, 10)),
        (np.int64(5), Fraction(5)),
        (np.float64(0.1), Fraction(1, 10)),
    ],
)
def test_rates_are_read_as_the_number_the_user_wrote(rate, exact):
    value = parse_rate(rate, "Rate")
    assert value == exact and type(value) is Fraction


def test_a_float_is_its_printed_decimal_not_its_binary_value():
    assert parse_rate(0.1, "Rate") == Fraction(1, 10)
    assert Fraction(0.1) != Fraction(1, 10)  # the reading a plain Fraction(float) would give instead
    assert sum(parse_rate(r, "Rate") for r in (0.1, 0.2, 0.7)) == 1


@pytest.mark.parametrize(
    ("rate", "message"),
    [
        (0, "Rate of task 'a' must be > 0 but got 0. Leave the task out instead."),
        (-2.5, "Rate of task 'a' must be > 0 but got -2.5. Leave the task out instead."),
        ("-1/3", "Rate of task 'a' must be > 0 but got '-1/3'. Leave the task out instead."),
        (float("nan"), "Rate of task 'a' must be a finite number but got nan."),
        (float("inf"), "Rate of task 'a' must be a finite number but got inf."),
        (decimal.Decimal("NaN"), "Rate of task 'a' must be a finite number but got Decimal('NaN')."),
        (
            True,
            "Rate of task 'a' must be a number (int, float, Fraction, Decimal or a string like '1/3') but got "
            "the bool True; write 1 for a rate of one.",
        ),
        (
            "nan",
            "Rate of task 'a' must be a number (int, float, Fraction, Decimal or a string like '1/3') but got "
            "the string 'nan'.",
        ),
        (
            "1/0",
            "Rate of task 'a' must be a number (int, float, Fraction, Decimal or a string like '1/3') but got "
            "the string '1/0'.",
        ),
        (
            None,
            "Rate of task 'a' must be a number (int, float, Fraction, Decimal or a string like '1/3') but got "
            "NoneType: None.",
        ),
        (
            np.float32(0.5),
            "Rate of task 'a' must be a number (int, float, Fraction, Decimal or a string like '1/3') but got "
            "float32: np.float32(0.5).",
        ),
    ],
)
def test_bad_rates_name_the_rate_the_value_and_the_fix(rate, message):
    with pytest.raises(ValueError) as raised:
        parse_rate(rate, "Rate of task 'a'")
    assert str(raised.value) == message
