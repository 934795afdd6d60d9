"""A directory to put first on ``PYTHONPATH`` so that Python programs use the simulated NVML.

Python imports ``sitecustomize`` at start-up from the first directory of its path that has one;
this package's ``sitecustomize.py`` then installs :mod:`nodeagent.sim.pynvml_compat` as the
``pynvml`` module before the program imports it. ``nodeagent sim exec`` sets it up.
"""

from __future__ import annotations

from pathlib import Path

PATH = Path(__file__).resolve().parent
