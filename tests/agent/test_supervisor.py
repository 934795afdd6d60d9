"""The supervisor restarts crashed components with backoff and stops them in bounded time."""

from __future__ import annotations

import threading

from nodeagent.agent.supervisor import Supervisor


class Flaky:
    """Crashes ``crashes`` times, then runs until stopped."""

    name = "flaky"

    def __init__(self, crashes: int) -> None:
        self.crashes = crashes
        self.runs = 0
        self.running = threading.Event()

    @property
    def ready(self) -> bool:
        return self.running.is_set()

    def run(self, stop: threading.Event) -> None:
        self.runs += 1
        if self.runs <= self.crashes:
            raise RuntimeError("boom")
        self.running.set()
        stop.wait()


def test_crashes_are_counted_and_restarted_with_growing_backoff() -> None:
    waits: list[float] = []

    def fake_sleep(stop: threading.Event, seconds: float) -> bool:
        waits.append(seconds)
        return stop.is_set()

    restarts: dict[str, int] = {}
    supervisor = Supervisor(restarts, sleep=fake_sleep)
    component = Flaky(crashes=3)
    supervisor.start(component)
    assert component.running.wait(5)
    assert restarts == {"flaky": 3}
    assert waits == [0.5, 1.0, 2.0]
    assert supervisor.alive()
    assert supervisor.stop(timeout_s=2) == []
    assert not supervisor.alive()


def test_a_component_that_ignores_stop_is_reported() -> None:
    release = threading.Event()

    class Stubborn:
        name = "stubborn"
        ready = True

        def run(self, stop: threading.Event) -> None:
            release.wait(10)

    supervisor = Supervisor({})
    supervisor.start(Stubborn())
    assert supervisor.stop(timeout_s=0.1) == ["stubborn"]
    release.set()


def test_a_recurring_crash_is_logged_with_its_traceback_once(caplog) -> None:
    restarts: dict[str, int] = {}
    supervisor = Supervisor(restarts, sleep=lambda stop, s: stop.is_set())
    component = Flaky(crashes=4)
    with caplog.at_level("ERROR"):
        supervisor.start(component)
        assert component.running.wait(5)
        supervisor.stop(timeout_s=2)
    crashes = [r for r in caplog.records if "crashed" in r.getMessage()]
    assert len(crashes) == 4
    assert crashes[0].exc_info is not None  # the first one explains itself
    assert all(r.exc_info is None for r in crashes[1:])  # the rest are one line each
    assert "RuntimeError: boom" in crashes[1].getMessage()
