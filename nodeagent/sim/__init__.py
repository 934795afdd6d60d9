"""A simulated NVML, importable in place of the ``pynvml`` module.

* :class:`~nodeagent.sim.nvml.SimNvml`: an object with pynvml's functions, constants, structs
  and ``NVMLError`` classes, backed by a node in a state directory shared between processes.
* :mod:`nodeagent.sim.pynvml_compat`: a module form of the same, configured from the environment.
* :class:`~nodeagent.sim.control.SimControl`: presets, processes, resets and fault injection.
"""

from __future__ import annotations

from nodeagent.sim.nvml import SimNvml
from nodeagent.sim.presets import describe_presets, preset_names
from nodeagent.sim.state import SimStateError, default_state_dir

__all__ = ["SimNvml", "SimStateError", "default_state_dir", "describe_presets", "preset_names"]
