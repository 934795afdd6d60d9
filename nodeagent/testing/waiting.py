"""Polling a condition from a test without sleeping longer than needed."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(cond: Callable[[], bool], timeout_s: float = 5.0, step_s: float = 0.01) -> bool:
    """True as soon as ``cond()`` holds, False when it still does not after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(step_s)
    return cond()
