"""The pool half's one reader and writer of quantities, timestamps and durations.

Quantities go through the project's exact parser (:mod:`nodeagent.config.quantity`, the
API server's grammar); timestamps are RFC 3339 as Kubernetes writes ``Time`` and
``MicroTime``. No other tiering module parses either: the areas read objects through the
floor's models or through these functions.
"""

from __future__ import annotations

import functools
import math
from datetime import UTC, datetime
from typing import Any

from nodeagent.config import quantity as exact


# Quantities repeat (``"1"``, ``"8"``, ``"40Gi"`` on 100,000 objects) and the exact parser works
# in fractions, so each distinct value is parsed once; both functions are pure.
@functools.lru_cache(maxsize=4096, typed=True)  # True and 1 are different inputs
def _count(value: Any) -> int:
    try:
        return exact.parse_count(value)
    except exact.QuantityError:
        return 0


@functools.lru_cache(maxsize=4096, typed=True)  # True and 1 are different inputs
def _amount(value: Any) -> float | str:
    try:
        return float(exact.parse_quantity(value))
    except exact.QuantityError as exc:
        return f"not a quantity: {exc}"


def count(value: Any) -> int:
    """An extended-resource quantity (``2``, ``"2"``, ``"2k"``) as a count of devices.

    The API server refuses a device count that is not a whole, non-negative quantity, and the
    cluster file is checked the same way when it is read, so the value 0 for one it would
    refuse is only ever seen for a hand-made object: it then counts as no devices, never as a
    traceback.
    """
    try:
        return _count(value)
    except TypeError:  # not hashable: not a quantity either
        return 0


def amount(value: Any) -> float:
    """A Kubernetes quantity (``4``, ``"4"``, ``"500m"``, ``"2k"``, ``"1Gi"``) as a number.

    A float for the sums and ratios the readers of Kueue objects compute. A value that is not a
    quantity raises ValueError.
    """
    try:
        parsed = _amount(value)
    except TypeError:
        parsed = f"not a quantity: {value!r}"
    if isinstance(parsed, str):
        raise ValueError(parsed)
    return parsed


def amount_or_zero(value: Any) -> float:
    """:func:`amount`, with 0 for a missing value or one the API server would refuse (a
    hand-made object must not stop a review)."""
    try:
        return amount(value if value is not None else 0)
    except ValueError:
        return 0.0


def quantity_text(value: float) -> str:
    """A number as the quantity nodeagent writes: an integer when it is one."""
    if math.isfinite(value) and value == int(value):
        return str(int(value))
    return f"{value:g}"


def parse_time(text: Any) -> float | None:
    """A Kubernetes Time or MicroTime (RFC 3339: ``Z`` or an offset) as epoch seconds.

    ``None`` for anything else, a time without a zone included (Kubernetes always writes one;
    reading it as local time would shift it by the reader's zone). ``datetime.fromisoformat``
    is the C parser: the review reads several timestamps from each of 100,000 workloads, where
    ``strptime`` alone would take seconds.
    """
    if not text or not isinstance(text, str) or len(text) < 20 or text[10] != "T":
        return None
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        return None
    return when.timestamp() if when.tzinfo is not None else None


def micro_time(epoch_s: float) -> str:
    """A Kubernetes MicroTime string."""
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


MAX_DURATION_S = 3650 * 86400.0  # past this a date before it is out of any calendar's range
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


def parse_duration(text: str) -> float:
    """``30d``, ``12h``, ``90m``, ``45s``, ``2w`` (or plain seconds) as seconds.

    Raises:
        ValueError: not a positive duration.
    """
    value = text.strip()
    unit = _UNITS.get(value[-1:]) if value else None
    number = value[:-1] if unit is not None else value
    try:
        seconds = float(number) * (unit or 1.0)
    except ValueError:
        raise ValueError(f"{text!r} is not a duration") from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"{text!r} is not a positive duration")
    if seconds > MAX_DURATION_S:
        raise ValueError(f"{text!r} is longer than the 10 years a duration may span")
    return seconds
