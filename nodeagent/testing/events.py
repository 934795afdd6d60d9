"""Feeding a node's NVML events to a consumer on a thread, as the agent's health-events
thread does, for tests and benchmarks that drive the health model without the whole agent."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from nodeagent.gpu.node import GpuNode
from nodeagent.gpu.types import GpuEvent


@contextmanager
def pumping_events(
    node: GpuNode, on_event: Callable[[GpuEvent], None], *, poll_s: float = 0.05
) -> Iterator[None]:
    """Within the block, every XID/ECC event of ``node`` goes to ``on_event`` as it arrives.

    The event set is opened before the block starts, so no event injected inside it is missed;
    on exit the thread stops and the event set is closed.
    """
    watcher = node.watch_events()
    stop = threading.Event()

    def pump() -> None:
        while not stop.is_set():
            event = watcher.wait(poll_s)
            if event is not None:
                on_event(event)

    thread = threading.Thread(target=pump, name="test-event-pump", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(2)
        watcher.close()
