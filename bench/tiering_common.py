"""What the tiering benchmarks share: their integer options and the percentile they report."""

from __future__ import annotations

import argparse
import math


def count_options(parser: argparse.ArgumentParser, **defaults: int) -> None:
    """One integer option per keyword, ``naive_every=20`` as ``--naive-every`` (default 20)."""
    for name, default in defaults.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=default)


def nearest_rank(samples: list[float], q: float) -> float:
    """The nearest-rank ``q`` quantile (``q=0.99``: the 198th of 200 sorted samples)."""
    ordered = sorted(samples)
    return ordered[max(math.ceil(q * len(ordered)) - 1, 0)]
