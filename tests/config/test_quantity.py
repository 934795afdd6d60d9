"""The one Kubernetes quantity parser: the API's grammar, exact values, what the server refuses."""

from __future__ import annotations

import time
from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kubernetes.utils import parse_quantity as client_parse_quantity

from nodeagent.config.quantity import (
    MAX,
    QuantityError,
    parse_count,
    parse_quantity,
    quantity_text,
)


@pytest.mark.parametrize(
    ("value", "exact"),
    [
        (2, Fraction(2)),
        ("2", Fraction(2)),
        ("2k", Fraction(2000)),  # the old tiering parser made this 0
        ("500m", Fraction(1, 2)),
        ("1.5Gi", Fraction(3 * 2**29)),
        ("1Ki", Fraction(1024)),
        ("1Ei", Fraction(2**60)),
        ("7E", Fraction(7 * 10**18)),  # E alone is exa, not an exponent
        ("1e3", Fraction(1000)),
        ("1E3", Fraction(1000)),
        ("1e+3", Fraction(1000)),
        ("25e-2", Fraction(1, 4)),
        ("1n", Fraction(1, 10**9)),
        ("3u", Fraction(3, 10**6)),
        (".5", Fraction(1, 2)),
        ("5.", Fraction(5)),
        ("+1", Fraction(1)),
        ("-1m", Fraction(-1, 1000)),
        ("0.1", Fraction(1, 10)),  # exact: no float on the way
        (0.1, Fraction(1, 10)),  # a YAML float reads as the text it was written as
        ("0.1n", Fraction(1, 10**9)),  # finer than nano: rounded up, as the API server does
        ("1e-400", Fraction(1, 10**9)),
        ("0e999999999", Fraction(0)),
        (str(MAX), Fraction(MAX)),
    ],
)
def test_the_grammar_and_exact_values(value: object, exact: Fraction) -> None:
    assert parse_quantity(value) == exact


@pytest.mark.parametrize(
    "value",
    [
        "",
        "lots",
        "2 k",
        " 2",
        "2\n",
        "1ki",  # suffixes are case-sensitive
        "1Zi",
        "1e",
        "1e3.5",  # the exponent is an integer
        "e3",
        ".",
        "+",
        "1.2.3",
        "--1",
        "0x10",
        "1_000",
        "\u0661",  # an Arabic-Indic digit: Python's int() takes it, Go's parser does not
        "nan",
        "inf",
        float("nan"),
        float("inf"),
        True,  # YAML's true is not a number
        None,
        [1],
        "1e400",  # larger than Kubernetes holds: refused, not an OverflowError
        10**30,
        str(MAX + 1),
        "8Ei",  # 2^63
        "1e999999999",  # must be refused at once, not computed
    ],
)
def test_what_the_api_server_refuses(value: object) -> None:
    started = time.monotonic()
    with pytest.raises(QuantityError, match=r"quantity|larger than Kubernetes holds"):
        parse_quantity(value)
    assert time.monotonic() - started < 0.5


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (-4, "negative"),
        ("-1", "negative"),
        ("500m", "not a whole number"),
        ("1.5", "not a whole number"),
        ("lots", "not a quantity"),
        (True, "not a quantity"),
        (10**30, "larger than Kubernetes holds"),
    ],
)
def test_device_counts_are_whole_and_not_negative(value: object, says: str) -> None:
    with pytest.raises(QuantityError, match=says):
        parse_count(value)


def test_device_counts() -> None:
    assert [parse_count(v) for v in (0, "8", "2k", "1e1", "1Ki")] == [0, 8, 2000, 10, 1024]


@pytest.mark.parametrize(
    ("value", "text"),
    [(Fraction(8), "8"), (Fraction(1, 2), "500m"), (Fraction(1, 10**9), "1n"), (3.0, "3")],
)
def test_quantity_text(value: Fraction | float, text: str) -> None:
    assert quantity_text(value) == text
    assert parse_quantity(text) == Fraction(value)


_SUFFIX = st.sampled_from(
    ["", "n", "u", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]
)


@st.composite
def _grammar_quantities(draw: st.DrawFn) -> str:
    """A string of the API's grammar, built from its productions."""
    sign = draw(st.sampled_from(["", "+", "-"]))
    whole = draw(st.text("0123456789", min_size=0, max_size=8))
    frac = draw(st.text("0123456789", min_size=0, max_size=4))
    if not whole and not frac:
        whole = "0"
    number = whole + ("." + frac if frac or draw(st.booleans()) else "")
    if number.startswith(".") and not frac:
        number = "0" + number
    if draw(st.booleans()):
        exponent = draw(st.integers(-12, 12))
        return f"{sign}{number}{draw(st.sampled_from('eE'))}{exponent}"
    return f"{sign}{number}{draw(_SUFFIX)}"


@given(_grammar_quantities())
def test_every_grammar_string_is_read_as_the_kubernetes_client_reads_it(text: str) -> None:
    """The client's parser is laxer (it takes '1 k'), but on the grammar the values agree;
    the API server additionally rounds below a nano-unit up, and refuses beyond int64."""
    exact = Fraction(Decimal(client_parse_quantity(text)))
    if abs(exact) > MAX:
        with pytest.raises(QuantityError):
            parse_quantity(text)
        return
    got = parse_quantity(text)
    if (exact * 10**9).denominator == 1:
        assert got == exact
    else:
        assert abs(got) > abs(exact)
        assert abs(got) - abs(exact) < Fraction(1, 10**9)
