"""A module that can stand in for ``pynvml``: ``sys.modules["pynvml"] = pynvml_compat``.

Its namespace is the real ``pynvml`` module's, name for name, as ``vars()``, ``dir()`` and
``from pynvml import *`` see it: the constants, ctypes structs, ``NVMLError`` classes (the same
class objects, so ``except pynvml.NVMLError_InUse`` catches what the simulator raises) and
helpers are pynvml's own, and every ``nvml*`` function is a plain function of the same name that
calls a :class:`~nodeagent.sim.nvml.SimNvml`. Functions the simulator does not model raise
NVMLError(NOT_SUPPORTED) as a driver that lacks the feature does; ``_nvmlGetFunctionPointer``
hands out the simulated C entry points (:mod:`nodeagent.sim.cabi`) and raises
FUNCTION_NOT_FOUND for the others, as pynvml does against an older driver.

The simulator behind it is configured from the environment: ``NODEAGENT_SIM_STATE`` (state
directory, default under the user's state dir), ``NODEAGENT_SIMULATE`` (preset that seeds an
empty state directory) and ``NODEAGENT_SIM_TIME`` (a fixed wall-clock time for the telemetry,
so separate programs read the same values). ``nodeagent sim exec`` sets these up.
"""

from __future__ import annotations

import functools
import os
import threading
import types
from collections.abc import Callable
from typing import Any

import pynvml as _pynvml

from nodeagent.sim.nvml import SimNvml
from nodeagent.sim.state import default_state_dir

_default: SimNvml | None = None
_default_lock = threading.Lock()

# pynvml helpers that are not NVML calls: kept as they are.
_HELPERS = frozenset(
    {"nvmlExceptionClass", "nvmlStructToFriendlyObject", "nvmlFriendlyObjectToStruct",
     "nvmlFriendlyObject"}
)  # fmt: skip


def default_instance() -> SimNvml:
    """The process-wide simulator, created on first use from the environment."""
    global _default
    with _default_lock:
        if _default is None:
            _default = SimNvml(default_state_dir(), os.environ.get("NODEAGENT_SIMULATE") or None)
        return _default


def _delegate(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    """A module-level ``name`` that calls the default simulator's ``name``."""

    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(default_instance(), name)(*args, **kwargs)

    call.__module__ = __name__
    return call


def _nvmlGetFunctionPointer(name: str) -> Any:
    """pynvml's private accessor of C entry points, answered by the simulated driver."""
    cached = _nvmlGetFunctionPointer_cache.get(name)
    if cached is not None:
        return cached
    pointer = default_instance()._nvmlGetFunctionPointer(name)
    _nvmlGetFunctionPointer_cache[name] = pointer
    return pointer


def _namespace() -> dict[str, Any]:
    """The names this module takes from pynvml, with NVML functions turned into delegates."""
    names: dict[str, Any] = {}
    for name, value in vars(_pynvml).items():
        if name.startswith("__"):
            continue
        if (
            isinstance(value, types.FunctionType)
            and name.startswith("nvml")
            and name not in _HELPERS
        ):
            names[name] = _delegate(name, value)
        else:
            names[name] = value
    return names


_nvmlGetFunctionPointer_cache: dict[str, Any] = {}
_OWN = {"_nvmlGetFunctionPointer", "_nvmlGetFunctionPointer_cache"}
globals().update({k: v for k, v in _namespace().items() if k not in _OWN})
nvmlLib = None  # no C library is loaded; the simulator answers instead

# ``from pynvml import *`` gives what it gives with the real module: its public names.
__all__ = sorted(name for name in vars(_pynvml) if not name.startswith("_"))
