"""An idle event wait sleeps like the driver does: it costs no CPU and still wakes at once."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pynvml

from nodeagent.sim.control import SimControl
from nodeagent.sim.nvml import SimNvml


def test_waiting_for_events_is_cheap_and_prompt(tmp_path: Path) -> None:
    nvml = SimNvml(tmp_path, "dgx-h100")
    nvml.nvmlInit()
    event_set = nvml.nvmlEventSetCreate()
    for i in range(8):
        handle = nvml.nvmlDeviceGetHandleByIndex(i)
        nvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, event_set)

    cpu_before = time.thread_time()
    wall_before = time.monotonic()
    try:
        nvml.nvmlEventSetWait(event_set, 1000)
        raise AssertionError("no event was injected")
    except pynvml.NVMLError_Timeout:
        pass
    assert time.monotonic() - wall_before >= 0.99
    assert time.thread_time() - cpu_before < 0.05  # asleep, not polling

    def inject_later() -> None:
        time.sleep(0.2)
        SimControl(tmp_path).inject("xid", 3, code=79)

    thread = threading.Thread(target=inject_later)
    thread.start()
    started = time.monotonic()
    data = nvml.nvmlEventSetWait(event_set, 5000)
    waited = time.monotonic() - started
    thread.join()
    assert data.eventData == 79
    assert waited < 0.2 + 0.1  # woken by the write, not by a timeout
    nvml.nvmlEventSetFree(event_set)
    nvml.nvmlShutdown()
