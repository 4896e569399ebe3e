"""Integer nanoseconds from the export's text to the final figure.

torch_npu writes timestamps as microsecond strings with three decimals since the
epoch ("1777097775243356.820", with a trailing tab in ``kernel_details.csv``). As a
float of seconds such a value keeps only ~0.24 us, so two identical steps at
different times got different figures. Every time here is parsed exactly
(:class:`decimal.Decimal` from the text) into an ``int`` of nanoseconds; sums,
unions and differences stay integers, and seconds appear only in the output
(:func:`seconds`), so identical steps give identical figures.
"""

from __future__ import annotations

from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation
from fractions import Fraction

NS_PER_US = 1_000
NS_PER_MS = 1_000_000
NS_PER_S = 1_000_000_000


def _exact(value: object, where: str) -> Decimal:
    text = str(value).strip()
    try:
        number = Decimal(text)
    except InvalidOperation as error:
        raise ValueError(f"{where}: {value!r} is not a number") from error
    if not number.is_finite():
        raise ValueError(f"{where}: {value!r} is not a finite number")
    return number


def to_ns(value: object, ns_per_unit: int, where: str = "time") -> int:
    """``value`` (text or number, in a unit of ``ns_per_unit`` ns) as whole nanoseconds.

    A float is read through its shortest ``repr`` (what a JSON reader or CSV writer
    kept), never through its binary expansion; sub-nanosecond digits round half-even.
    """
    scaled = _exact(value, where) * ns_per_unit
    return int(scaled.to_integral_value(rounding=ROUND_HALF_EVEN))


def us_to_ns(value: object, where: str = "time (us)") -> int:
    return to_ns(value, NS_PER_US, where)


def ms_to_ns(value: object, where: str = "time (ms)") -> int:
    return to_ns(value, NS_PER_MS, where)


def seconds(ns: int | Fraction) -> float:
    """Nanoseconds (an int, or an exact mean of ints) as seconds, correctly rounded once:
    the one place a figure becomes a float."""
    return float(Fraction(ns) / NS_PER_S)
