"""Mixing rates as exact fractions: the user's numbers, read one way by mixtures and run plans alike.

A rate is an int, a ``Fraction``, a ``Decimal``, a string like ``'1/3'`` or ``'0.25'``, or a float read
as the decimal it prints as (``0.1`` is 1/10, not the binary number nearest to it), so that rates
0.1/0.2/0.7 mix in exactly the proportions 1:2:7 on every machine. Rates have any positive scale; a run
plan divides them by their sum, once. ``str(fraction)`` writes a rate back (``'3'``, ``'1/3'``).
"""

from __future__ import annotations

import decimal
import math
import numbers
from fractions import Fraction

__all__ = ["parse_rate"]

_KINDS = "int, float, Fraction, Decimal or a string like '1/3'"


def parse_rate(rate: object, what: str) -> Fraction:
    """``rate`` as an exact positive ``Fraction``; a ``ValueError`` that starts with ``what`` otherwise."""
    if isinstance(rate, bool):  # an int to Python, but True is no one's idea of a rate
        raise ValueError(
            f"{what} must be a number ({_KINDS}) but got the bool {rate!r}; write 1 for a rate of one."
        )
    if isinstance(rate, float):
        if not math.isfinite(rate):
            raise ValueError(f"{what} must be a finite number but got {rate!r}.")
        value = Fraction(repr(float(rate)))  # float() first: numpy's float64 prints as 'np.float64(...)'
    elif isinstance(rate, numbers.Rational):  # int, Fraction, numpy integers
        # int(): numpy integers would otherwise stay the Fraction's numerator and overflow in arithmetic.
        value = Fraction(int(rate.numerator), int(rate.denominator))
    elif isinstance(rate, decimal.Decimal):
        if not rate.is_finite():
            raise ValueError(f"{what} must be a finite number but got {rate!r}.")
        value = Fraction(rate)
    elif isinstance(rate, str):
        try:
            value = Fraction(rate)
        except (ValueError, ZeroDivisionError):
            raise ValueError(f"{what} must be a number ({_KINDS}) but got the string {rate!r}.") from None
    else:
        raise ValueError(f"{what} must be a number ({_KINDS}) but got {type(rate).__name__}: {rate!r}.")
    if value <= 0:
        raise ValueError(f"{what} must be > 0 but got {rate!r}. Leave the task out instead.")
    return value
