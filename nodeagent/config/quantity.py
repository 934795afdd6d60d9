"""Kubernetes resource quantities (``2``, ``500m``, ``1.5Gi``, ``4k``, ``1e3``): the one parser.

Every quantity nodeagent reads (pod requests and limits, node allocatable, Kueue quotas, the
files its commands read) goes through :func:`parse_quantity`, which follows the grammar of
``k8s.io/apimachinery/pkg/api/resource.Quantity``::

    <quantity>        ::= <signedNumber><suffix>
    <signedNumber>    ::= <number> | <sign><number>           (sign: + or -)
    <number>          ::= <digits> | <digits>.<digits> | <digits>. | .<digits>
    <suffix>          ::= <binarySI> | <decimalExponent> | <decimalSI>
    <binarySI>        ::= Ki | Mi | Gi | Ti | Pi | Ei
    <decimalSI>       ::= n | u | m | "" | k | M | G | T | P | E
    <decimalExponent> ::= "e" <signedInteger> | "E" <signedInteger>

The value is exact (a :class:`~fractions.Fraction`, never a float: ``0.1`` stays one tenth).
What the API server refuses is refused here: anything off the grammar (``lots``, ``2 k``,
``1Zi``, an empty string, ``true``), NaN and infinities. Kubernetes documents that no quantity
may exceed 2^63-1 in magnitude (its ``Value()`` and the quotas built on it are int64), so a
larger one (``1e400``, ``10**30``) is refused rather than silently capped. Precision finer than
a nano-unit is rounded up to it, as the API server does (``0.1n`` is ``1n``).

:func:`parse_count` adds the rules for extended resources such as ``nvidia.com/gpu``: a whole
number, not negative (the API server's "must be an integer" and "must be greater than or equal
to 0").
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

MAX = 2**63 - 1  # the largest magnitude a Kubernetes quantity holds (int64)
_NANO = Fraction(1, 10**9)

_SUFFIXES: dict[str, Fraction] = {
    "Ki": Fraction(2**10),
    "Mi": Fraction(2**20),
    "Gi": Fraction(2**30),
    "Ti": Fraction(2**40),
    "Pi": Fraction(2**50),
    "Ei": Fraction(2**60),
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
# ASCII digits only (`\d` would take other scripts' digits, which Go's parser does not).
_GRAMMAR = re.compile(
    r"([+-]?)([0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)|[eE]([+-]?[0-9]+))?"
)
HINT = "a number with an optional suffix, like 2, 500m, 1.5Gi, 4k or 1e3"


class QuantityError(ValueError):
    """Not a quantity Kubernetes accepts; the message says why, without naming the field."""


def parse_quantity(value: object) -> Fraction:
    """``value`` (text as in a manifest, or a YAML/JSON number) as an exact number.

    Raises:
        QuantityError: ``value`` is not a quantity the API server accepts.
    """
    if isinstance(value, bool):  # YAML's true/false; bool is an int in Python
        raise QuantityError(f"{value!r} is not a quantity ({HINT})")
    if isinstance(value, int):
        return _bounded(Fraction(value), value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise QuantityError(f"{value!r} is not a quantity ({HINT})")
        value = repr(value)  # the shortest text that reads back as this float: 0.1 is "0.1"
    if not isinstance(value, str):
        raise QuantityError(f"{value!r} is not a quantity ({HINT})")
    match = _GRAMMAR.fullmatch(value)
    if match is None:
        raise QuantityError(f"{value!r} is not a quantity ({HINT})")
    sign, number, suffix, exponent = match.groups()
    mantissa = Fraction(number + "0" if number.endswith(".") else number)
    if sign == "-":
        mantissa = -mantissa
    if mantissa == 0:
        return Fraction(0)
    if exponent is None:
        return _bounded(mantissa * _SUFFIXES[suffix or ""], value)
    power = int(exponent)
    # Bound the exponent before computing 10**power: `1e999999999` must not take the CPU.
    # |mantissa| is within [10**-len(number), 10**len(number)], so these limits are safe.
    if power - len(number) > 19:
        raise _too_large(value)
    if power + len(number) < -19:
        return _NANO if mantissa > 0 else -_NANO  # rounded up to a nano-unit, as the API does
    return _bounded(mantissa * Fraction(10) ** power, value)


def parse_count(value: object) -> int:
    """A count of an extended resource (``nvidia.com/gpu: 2``): whole and not negative.

    Raises:
        QuantityError: not a quantity, a fraction, or negative.
    """
    amount = parse_quantity(value)
    if amount < 0:
        raise QuantityError(f"{value!r} is negative; a count is 0 or more")
    if amount.denominator != 1:
        raise QuantityError(f"{value!r} is not a whole number; a device count must be one")
    return int(amount)


def quantity_text(value: Fraction | int | float) -> str:
    """A number as nodeagent writes a quantity: an integer when it is one, else in milli-units
    (rounded up, as the API server would) when that is whole, else nano-units."""
    exact = Fraction(value)
    if exact.denominator == 1:
        return str(int(exact))
    milli = exact * 1000
    if milli.denominator == 1:
        return f"{int(milli)}m"
    return f"{math.ceil(exact / _NANO)}n"


def _bounded(amount: Fraction, value: object) -> Fraction:
    if abs(amount) > MAX:
        raise _too_large(value)
    if (amount / _NANO).denominator != 1:
        # Finer than a nano-unit: the API server rounds up (away from zero) to one.
        nanos = math.ceil(abs(amount) / _NANO)
        amount = nanos * _NANO if amount > 0 else -nanos * _NANO
    return amount


def _too_large(value: object) -> QuantityError:
    return QuantityError(f"{value!r} is larger than Kubernetes holds (at most 2^63-1)")
