"""Reconfiguration: layout transitions with busy instances, nodeagent vs wipe-and-recreate.

    python bench/mig_reconfig.py [--seeds 5]

For every ordered pair of layouts (the standard ones plus mixed ones) on each MIG model, the
start layout is placed by the planner, a seeded ~30% of its instances are marked busy, and the
target is planned. nodeagent keeps what the target still contains and refuses to touch busy
instances; wipe-and-recreate (mig-parted's apply) destroys every instance on a GPU whose counts
differ, so it succeeds without touching busy instances only when none is busy.
"""

from __future__ import annotations

import argparse
import random
import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])

from mig_common import geometries

from mig.planner import BlockedByBusyError, Instance, check_layout, plan_gpu, rank_order
from nodeagent.gpu.types import MigGeometry


def layouts(geometry: MigGeometry) -> dict[str, dict[str, int]]:
    """Standard layouts (as in the shipped file) and a few mixed ones, by profile size."""
    names = [n for n in rank_order(geometry) if "+" not in n]
    big = names[0]
    if geometry.memory_slices == 4:  # A30: 4g, 2g, 1g
        four, two, one = big, names[1], names[-1]
        cands = {
            "all-1g": {one: 4},
            "all-2g": {two: 2},
            "all-4g": {four: 1},
            "all-balanced": {one: 2, two: 1},
            "2g+1g": {two: 1, one: 1},
            "1g": {one: 1},
        }
    else:
        seven, four, three, two, one2x, one = (
            names[0],
            names[1],
            names[2],
            names[3],
            names[4],
            names[5],
        )
        cands = {
            "all-1g": {one: 7},
            "all-2g": {two: 3},
            "all-3g": {three: 2},
            "all-4g": {four: 1},
            "all-7g": {seven: 1},
            "all-balanced": {one: 2, two: 1, three: 1},
            "4g+3g": {four: 1, three: 1},
            "3g+1g": {three: 1, one: 3},
            "2g+1g": {two: 2, one: 3},
            "1g.2x": {one2x: 4},
            "3g+2x": {three: 1, one2x: 2},
            "3g": {three: 1},
        }
    return {k: v for k, v in cands.items() if check_layout(geometry, v) is None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--busy", type=float, default=0.3)
    args = ap.parse_args()
    print(
        f"{'model':<11} {'transitions':>11}  {'destroyed: nodeagent':>20} {'wipe':>6}  "
        f"{'ok w/o touching busy: nodeagent':>31} {'wipe':>6}"
    )
    grand = [0, 0, 0, 0, 0]
    for label, geometry in geometries().items():
        table = layouts(geometry)
        n = d_na = d_wipe = ok_na = ok_wipe = 0
        for seed in range(args.seeds):
            rng = random.Random(seed)
            for a, start in table.items():
                placed = plan_gpu(geometry, [], start).create
                current = [
                    Instance(c.profile, c.placement, busy=rng.random() < args.busy, instance_id=i)
                    for i, c in enumerate(placed)
                ]
                for b, target in table.items():
                    if a == b:
                        continue
                    n += 1
                    d_wipe += len(current)
                    ok_wipe += not any(c.busy for c in current)
                    try:
                        plan = plan_gpu(geometry, current, target)
                    except BlockedByBusyError:
                        # nodeagent then changes nothing (and says which instance blocks).
                        continue
                    ok_na += 1
                    d_na += len(plan.destroy)
        # Destroy counts are compared on the transitions both approaches carried out.
        print(f"{label:<11} {n:>11}  {d_na:>20} {d_wipe:>6}  {ok_na:>31} {ok_wipe:>6}")
        for i, v in enumerate((n, d_na, d_wipe, ok_na, ok_wipe)):
            grand[i] += v
    n, d_na, d_wipe, ok_na, ok_wipe = grand
    print()
    print(
        f"all models: {n} transitions; nodeagent destroyed {d_na} instances "
        f"(wipe-and-recreate: {d_wipe}, {d_wipe / max(d_na, 1):.1f}x more); "
        f"succeeded without touching busy instances: nodeagent {ok_na} ({ok_na / n:.0%}), "
        f"wipe {ok_wipe} ({ok_wipe / n:.0%})"
    )


if __name__ == "__main__":
    main()
