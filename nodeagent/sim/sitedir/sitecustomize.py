"""Installed by ``nodeagent sim exec``: the simulated NVML stands in for the ``pynvml`` module.

Python runs this at start-up because its directory comes first on ``PYTHONPATH``. Any other
``sitecustomize`` the environment has (a distribution's, say) still runs afterwards.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path


def _install() -> None:
    try:
        from nodeagent.sim import pynvml_compat
    except ImportError as exc:  # another interpreter than nodeagent's: say so, run unchanged
        sys.stderr.write(f"nodeagent sim exec: simulated NVML not installed ({exc})\n")
        return
    sys.modules["pynvml"] = pynvml_compat


def _chain() -> None:
    """Run the next ``sitecustomize`` on the path, the one this file hides."""
    here = Path(__file__).resolve().parent
    rest = [p for p in sys.path if p and Path(p).resolve() != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None or spec.origin == __file__:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


_install()
_chain()
