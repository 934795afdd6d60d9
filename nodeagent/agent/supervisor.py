"""Runs each component on its own thread and restarts crashed ones with backoff."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from nodeagent.runtime.backoff import Backoff
from nodeagent.runtime.component import Component

log = logging.getLogger(__name__)

INITIAL_BACKOFF_S = 0.5
MAX_BACKOFF_S = 30.0
# A component that ran this long before crashing is considered to have recovered, so its
# backoff starts again from the initial value instead of growing without bound.
HEALTHY_RUN_S = 60.0


class Supervisor:
    """Owns the component threads.

    A crash is logged with its traceback, counted in ``restarts`` (exported as a metric), and
    the component is started again after an exponential backoff (0.5 s doubling to 30 s).
    """

    def __init__(
        self,
        restarts: dict[str, int],
        *,
        sleep: Callable[[threading.Event, float], bool] | None = None,
    ) -> None:
        self.restarts = restarts
        self.stop_event = threading.Event()
        self._threads: dict[str, threading.Thread] = {}
        self._components: list[Component] = []
        self._sleep = sleep or (lambda ev, s: ev.wait(s))
        self._heartbeat = time.monotonic()

    @property
    def components(self) -> list[Component]:
        """The supervised components, in start order."""
        return list(self._components)

    def start(self, component: Component) -> None:
        """Start ``component`` on a supervised thread."""
        self._components.append(component)
        self.restarts.setdefault(component.name, 0)
        thread = threading.Thread(
            target=self._loop, args=(component,), name=f"nodeagent-{component.name}", daemon=True
        )
        self._threads[component.name] = thread
        thread.start()

    def _loop(self, component: Component) -> None:
        backoff = Backoff(INITIAL_BACKOFF_S, MAX_BACKOFF_S)
        last_error: str | None = None
        while not self.stop_event.is_set():
            started = time.monotonic()
            try:
                component.run(self.stop_event)
            except Exception as exc:
                if time.monotonic() - started > HEALTHY_RUN_S:
                    backoff.succeed()
                delay = backoff.fail()
                # The first crash of a kind gets its traceback; the same error again (a port
                # that stays taken, say) is one line per restart, so the log stays readable.
                summary = f"{type(exc).__name__}: {exc}"
                if summary != last_error:
                    log.exception(
                        "component %s crashed; restarting in %.1fs", component.name, delay
                    )
                else:
                    log.error(
                        "component %s crashed again (%s); restarting in %.1fs",
                        component.name,
                        summary,
                        delay,
                    )
                last_error = summary
                self.restarts[component.name] = self.restarts.get(component.name, 0) + 1
                if self._sleep(self.stop_event, delay):
                    return
                continue
            if not self.stop_event.is_set():
                log.error("component %s returned without being stopped; restarting", component.name)
                self.restarts[component.name] = self.restarts.get(component.name, 0) + 1
                if self._sleep(self.stop_event, max(backoff.delay_s, backoff.initial_s)):
                    return
            else:
                return

    def alive(self) -> bool:
        """Whether every component thread is running (for the systemd watchdog)."""
        return all(t.is_alive() for t in self._threads.values())

    def stop(self, timeout_s: float) -> list[str]:
        """Signal every component and wait up to ``timeout_s`` in total; return stragglers."""
        self.stop_event.set()
        deadline = time.monotonic() + timeout_s
        stragglers = []
        for name, thread in self._threads.items():
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                stragglers.append(name)
        if stragglers:
            log.error("components still running after %.1fs: %s", timeout_s, ", ".join(stragglers))
        return stragglers
