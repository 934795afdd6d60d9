"""A ``libnvidia-ml.so.1`` over the simulator: any NVML program on a simulated node.

``build()`` compiles it (see :mod:`~nodeagent.sim.libnvml.builder`); the C entry points forward to
:mod:`~nodeagent.sim.libnvml.bridge`, which answers from the same simulated node every other
reader sees. ``python -m nodeagent.sim.libnvml`` builds it and prints its directory.
"""

from nodeagent.sim.libnvml.builder import BuildError, build

__all__ = ["BuildError", "build"]
