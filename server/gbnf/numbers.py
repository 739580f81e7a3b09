"""Exact GBNF for numeric ranges: JSON integers and plain decimals between two bounds."""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any


def bound_value(value: object) -> Decimal | None:
    """A bound keyword's value as an exact decimal; None unless it is a finite number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float):
        # the shortest text that reads back as this float: what a JSON validator compares with
        return Decimal(repr(value)) if math.isfinite(value) else None
    return Decimal(value)


def numeric_bounds(schema: dict[str, Any]) -> tuple[Decimal | None, bool, Decimal | None, bool]:
    """``(low, low_open, high, high_open)`` from a schema's bound keywords (None: unbounded).

    ``exclusiveMinimum``/``exclusiveMaximum`` may be numbers (JSON Schema draft 6 on) or, as in
    draft 4, ``true`` to make ``minimum``/``maximum`` exclusive. Of two bounds on one side the
    tighter holds; values that are not finite numbers are ignored.
    """
    lows: list[tuple[Decimal, bool]] = []
    highs: list[tuple[Decimal, bool]] = []
    for key, flag, bounds in (("minimum", "exclusiveMinimum", lows), ("maximum", "exclusiveMaximum", highs)):
        inclusive = bound_value(schema.get(key))
        if inclusive is not None:
            bounds.append((inclusive, schema.get(flag) is True))
        exclusive = bound_value(schema.get(flag))
        if exclusive is not None:
            bounds.append((exclusive, True))
    low, low_open = max(lows, default=(None, False))  # on a tie the open bound wins
    high, high_open = min(highs, key=lambda bound: (bound[0], not bound[1]), default=(None, False))
    return low, low_open, high, high_open


def _alternation(alternatives: list[str]) -> str:
    return alternatives[0] if len(alternatives) == 1 else "(" + " | ".join(alternatives) + ")"


def _render_digits(sequence: list[tuple[int, int]]) -> str:
    """GBNF for a sequence of digit ranges: runs of fixed digits as one literal, ``[0-9]{k}``."""
    parts = []
    i = 0
    while i < len(sequence):
        low, high = sequence[i]
        j = i + 1
        if low == high:
            while j < len(sequence) and sequence[j][0] == sequence[j][1]:
                j += 1
            parts.append('"' + "".join(str(digit) for digit, _ in sequence[i:j]) + '"')
        elif (low, high) == (0, 9):
            while j < len(sequence) and sequence[j] == (0, 9):
                j += 1
            parts.append("[0-9]" if j - i == 1 else f"[0-9]{{{j - i}}}")
        else:
            parts.append(f"[{low}-{high}]")
        i = j
    return " ".join(parts)


def _same_length(low: str, high: str) -> list[list[tuple[int, int]]]:
    """Digit-range sequences matching exactly the digit strings from `low` to `high`, both of
    one length (strings of one length compare like the numbers they spell).

    Where the first digits agree, that digit is fixed and the rest is the same problem one digit
    shorter. Where they differ (a < b), the strings fall into three sets: first digit a with a
    rest of at least low's rest, first digit strictly between a and b with any rest, first digit
    b with a rest of at most high's rest. A side whose bound rest is 00... (or 99...) restricts
    nothing, so its digit joins the middle set.
    """
    if not low:
        return [[]]
    first, last = int(low[0]), int(high[0])
    size = len(low) - 1
    if first == last:
        return [[(first, first), *tail] for tail in _same_length(low[1:], high[1:])]
    sequences = []
    low_free = low[1:] == "0" * size
    high_free = high[1:] == "9" * size
    if not low_free:
        sequences += [[(first, first), *tail] for tail in _same_length(low[1:], "9" * size)]
    middle = (first if low_free else first + 1, last if high_free else last - 1)
    if middle[0] <= middle[1]:
        sequences.append([middle] + [(0, 9)] * size)
    if not high_free:
        sequences += [[(last, last), *tail] for tail in _same_length("0" * size, high[1:])]
    return sequences


# The digits of a plain integer in llama-cpp-python's converter ("integral-part": 1 to 16); an
# integer or number range open on one side keeps that bound on its open side.
OPEN_RANGE_DIGITS = 16


def natural_range(low: int, high: int | None) -> list[str]:
    """GBNF alternatives matching exactly the numerals of the integers from `low` to `high`.

    ``0 <= low``; `high` None means no upper bound in the schema: the grammar then stops at
    `OPEN_RANGE_DIGITS` digits (or `low`'s own count, if larger), as a plain integer does, so
    that sampling cannot run away on digits. Numerals are written without leading zeros ("0"
    itself excepted). Numerals of one length compare as strings, so the range is cut into one
    piece per length (the first from `low`, the last up to `high`, those between from
    10^(n-1) to 10^n - 1), each spelled by `_same_length`. An empty range gives no alternatives.

    For example [7, 123]: ``[7-9] | [1-9] [0-9] | "1" [0-1] [0-9] | "12" [0-3]``.
    """
    if high is None:
        high = 10 ** max(OPEN_RANGE_DIGITS, len(str(low))) - 1
    if high < low:
        return []
    width = len(str(low))
    top = len(str(high))
    alternatives = []
    for size in range(width, top + 1):
        start = low if size == width else 10 ** (size - 1)
        end = high if size == top else 10**size - 1
        alternatives += [_render_digits(sequence) for sequence in _same_length(str(start), str(end))]
    return alternatives


def integer_range(low: int | None, high: int | None) -> str | None:
    """A GBNF expression matching exactly the JSON integers from `low` to `high` (None: that
    side is unbounded), or None when there are none. Negative numbers are "-" and a numeral of
    at least 1 (never "-0")."""
    alternatives = []
    if high is None or high >= 0:
        alternatives += natural_range(max(low, 0) if low is not None else 0, high)
    if low is None or low < 0:
        negative = natural_range(1 if high is None or high >= 0 else -high, None if low is None else -low)
        if negative:
            alternatives.append('"-" ' + _alternation(negative))
    return _alternation(alternatives) if alternatives else None


# The converter allows 1-16 fraction digits; bounded numbers allow as many (or the bounds' own).
_FRACTION_PLACES = 16


def _decimal_parts(value: Decimal) -> tuple[int, str]:
    """A non-negative decimal's integer part and fraction digits (without trailing zeros)."""
    whole, _, fraction = format(value, "f").partition(".")
    return int(whole), fraction.rstrip("0")


def _fraction(low: str | None, low_open: bool, high: str | None, high_open: bool, places: int) -> str | None:
    """GBNF for the optional ``.DIGITS`` after an integer part, for fractions 0.DIGITS from
    0.`low` to 0.`high` (a bound None: that side is unbounded; open: the bound itself excluded).

    Answers None when no suffix fits and "" when only the empty one does. Digits are read left
    to right, tracking whether those so far still equal the bound's first digits ("tight"):
    while tight to the low bound the next digit may not go below the bound's, and the rest
    only matters if it is equal; likewise for the high bound. Off both bounds, any digits follow.
    """

    def rest(i: int, tight_low: bool, tight_high: bool) -> tuple[bool, str | None]:
        # (whether the digits may end here, GBNF for one or more further digits or None)
        assert low is not None or not tight_low
        assert high is not None or not tight_high
        if tight_low and i >= len(low) and not low_open:
            tight_low = False  # the digits so far equal the whole bound: anything further is >=
        can_end = (not tight_low or (not low_open and not low[i:].strip("0"))) and (
            not tight_high or not high_open or bool(high[i:].strip("0"))
        )
        if i == places:
            return can_end, None
        if not tight_low and not tight_high:
            return True, f"[0-9]{{1,{places - i}}}"
        lowest = int(low[i]) if tight_low and i < len(low) else 0
        highest = (int(high[i]) if i < len(high) else 0) if tight_high else 9
        runs: list[list] = []  # [first digit, last digit, stays tight low, stays tight high]
        for digit in range(lowest, highest + 1):
            key = (tight_low and digit == lowest, tight_high and digit == highest)
            if runs and tuple(runs[-1][2:]) == key:
                runs[-1][1] = digit
            else:
                runs.append([digit, digit, *key])
        options = []
        for first, last, next_low, next_high in runs:
            ends, more = rest(i + 1, next_low, next_high)
            digit = _render_digits([(first, last)])
            if more is not None:
                options.append(f"{digit} ({more}){'?' if ends else ''}")
            elif ends:
                options.append(digit)
        return can_end, " | ".join(options) or None

    can_end, digits = rest(0, low is not None, high is not None)
    if digits is None:
        return "" if can_end else None
    return f'("." ({digits}))?' if can_end else f'"." ({digits})'


def _magnitudes(low: Decimal, low_open: bool, high: Decimal | None, high_open: bool) -> list[str]:
    """GBNF alternatives for unsigned numerals (integer part, optional fraction, no exponent) of
    the values from `low` (>= 0) to `high` (None: unbounded)."""
    if high is not None and (high < low or (high == low and (low_open or high_open))):
        return []
    low_whole, low_digits = _decimal_parts(low)
    high_whole, high_digits = _decimal_parts(high) if high is not None else (None, "")
    places = max(_FRACTION_PLACES, len(low_digits), len(high_digits))
    if high_whole == low_whole:
        pieces = [([f'"{low_whole}"'], _fraction(low_digits, low_open, high_digits, high_open, places))]
    else:
        between = natural_range(low_whole + 1, None if high_whole is None else high_whole - 1)
        pieces = [
            ([f'"{low_whole}"'], _fraction(low_digits, low_open, None, False, places)),
            (between, _fraction(None, False, None, False, places)),
        ]
        if high_whole is not None:
            pieces.append(([f'"{high_whole}"'], _fraction(None, False, high_digits, high_open, places)))
    return [
        f"{_alternation(numerals)} {suffix}".rstrip() for numerals, suffix in pieces if numerals and suffix is not None
    ]


def number_range(low: Decimal | None, low_open: bool, high: Decimal | None, high_open: bool) -> str | None:
    """A GBNF expression for JSON numbers from `low` to `high`, or None when it matches none.

    Sound, not complete: every number it matches is in range, and it matches every number in
    range written without exponent, with at most 16 fraction digits (or as many as a bound has),
    and not as negative zero; exponent forms are not allowed.
    """
    alternatives = []
    if high is None or high > 0 or (high == 0 and not high_open):
        start, start_open = (low, low_open) if low is not None and low >= 0 else (Decimal(0), False)
        alternatives += _magnitudes(start, start_open, high, high_open)
    if low is None or low < 0:
        start, start_open = (high.copy_negate(), high_open) if high is not None and high < 0 else (Decimal(0), True)
        negative = _magnitudes(start, start_open, None if low is None else low.copy_negate(), low_open)
        if negative:
            alternatives.append('"-" ' + _alternation(negative))
    return _alternation(alternatives) if alternatives else None
