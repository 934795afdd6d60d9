"""Planner speed: plan 8 GPUs (minimal-disruption search) from random layouts to random targets.

    python bench/mig_planner_speed.py [--rounds 300]

Baseline in the same run: planning the same targets from empty GPUs (no keep/destroy search),
which is what a wipe-and-recreate tool needs.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time

sys.path.insert(0, __file__.rsplit("/", 1)[0])

import contextlib

from mig_common import geometries
from mig_reconfig import layouts

from nodeagent_mig.planner import BlockedByBusyError, Instance, plan_gpu


def pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(q * len(s)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=300)
    args = ap.parse_args()
    print(
        f"{'model':<11} {'nodeagent median ms':>19} {'p99 ms':>7}   "
        f"{'from-empty median ms':>20} {'p99 ms':>7}"
    )
    worst = 0.0
    for label, geometry in geometries().items():
        table = list(layouts(geometry).values())
        rng = random.Random(7)
        ours: list[float] = []
        base: list[float] = []
        for _ in range(args.rounds):
            gpus = []
            for _g in range(8):
                start = rng.choice(table)
                current = [
                    Instance(c.profile, c.placement, busy=rng.random() < 0.3, instance_id=i)
                    for i, c in enumerate(plan_gpu(geometry, [], start).create)
                ]
                gpus.append((current, rng.choice(table)))
            t0 = time.perf_counter()
            for current, target in gpus:
                with contextlib.suppress(BlockedByBusyError):
                    plan_gpu(geometry, current, target, force=True)
            ours.append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            for _current, target in gpus:
                plan_gpu(geometry, [], target)
            base.append((time.perf_counter() - t0) * 1000)
        worst = max(worst, pct(ours, 0.99))
        print(
            f"{label:<11} {statistics.median(ours):>19.2f} {pct(ours, 0.99):>7.2f}   "
            f"{statistics.median(base):>20.2f} {pct(base, 0.99):>7.2f}"
        )
    print(f"\nworst p99 for 8 GPUs: {worst:.2f} ms (target < 50 ms)")


if __name__ == "__main__":
    main()
