"""A module that can stand in for ``pynvml``: ``sys.modules["pynvml"] = pynvml_compat``.

Module-level names resolve on a default :class:`~nodeagent.sim.nvml.SimNvml` configured from
the environment: ``NODEAGENT_SIM_STATE`` (state directory, default under the user's state
dir) and ``NODEAGENT_SIMULATE`` (preset that seeds an empty state directory). This lets a
third-party pynvml tool run against a simulated node unchanged.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from nodeagent.sim.nvml import SimNvml
from nodeagent.sim.state import default_state_dir

_default: SimNvml | None = None
_default_lock = threading.Lock()


def default_instance() -> SimNvml:
    """The process-wide simulator, created on first use from the environment."""
    global _default
    with _default_lock:
        if _default is None:
            _default = SimNvml(default_state_dir(), os.environ.get("NODEAGENT_SIMULATE") or None)
        return _default


def __getattr__(name: str) -> Any:
    """Every pynvml name, answered by the default simulator."""
    if name.startswith("__"):
        raise AttributeError(name)
    return getattr(default_instance(), name)
