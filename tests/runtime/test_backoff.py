"""One backoff rule for every retry: initial, doubling, capped, reset after a success."""

from __future__ import annotations

import pytest

from nodeagent.runtime.backoff import Backoff
from nodeagent.runtime.subscribers import Subscribers


def test_delays_double_up_to_the_cap_and_restart_after_a_success() -> None:
    backoff = Backoff(0.5, 3.0)
    assert backoff.delay_s == 0.0
    assert [backoff.fail() for _ in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    backoff.succeed()
    assert backoff.fail() == 0.5


def test_a_thing_failing_for_days_does_not_overflow() -> None:
    backoff = Backoff(0.5, 30.0)
    for _ in range(5000):
        backoff.fail()
    assert backoff.delay_s == 30.0


@pytest.mark.parametrize(("initial", "cap"), [(0.0, 1.0), (2.0, 1.0), (-1.0, 1.0)])
def test_bad_bounds_are_refused(initial: float, cap: float) -> None:
    with pytest.raises(ValueError, match="backoff needs"):
        Backoff(initial, cap)


def test_a_failing_subscriber_does_not_starve_the_others() -> None:
    subscribers: Subscribers[int] = Subscribers("test subscriber")
    seen: list[int] = []

    def broken(value: int) -> None:
        raise RuntimeError(value)

    subscribers.add(broken)
    remove = subscribers.add(seen.append)
    subscribers.notify(1)
    remove()
    subscribers.notify(2)
    assert seen == [1]
