"""``python -m nodeagent.sim.libnvml``: build the simulated libnvidia-ml.so.1, print its folder."""

import sys

from nodeagent.sim.libnvml.builder import BuildError, build

try:
    print(build())
except BuildError as exc:
    print(f"libnvml: {exc}", file=sys.stderr)
    sys.exit(2)
