"""Reconfiguration: layout transitions with busy instances, nodeagent vs wipe-and-recreate.

    python bench/mig_reconfig.py [--seeds 5]

For every ordered pair of layouts (the standard ones plus mixed ones) on each MIG model, the
start layout is placed by the planner, a seeded ~30% of its instances are marked busy, and the
target is planned. nodeagent keeps what the target still contains and refuses a transition
whose every plan destroys a busy instance (it changes nothing and names the blockers);
wipe-and-recreate (mig-parted's apply) destroys every instance on a GPU whose counts differ,
busy ones included.

Destroy counts are compared only over the transitions both approaches carry out (the ones
nodeagent does not refuse), and again over the subset where no instance is busy. Refused
transitions are counted on their own: what wipe-and-recreate destroys there (busy instances
included), and what nodeagent would destroy with ``--force``.
"""

from __future__ import annotations

import argparse
import random
import sys
from dataclasses import dataclass, fields

sys.path.insert(0, __file__.rsplit("/", 1)[0])

from mig_common import geometries

from nodeagent.capacity import rank_order
from nodeagent.gpu.types import MigGeometry
from nodeagent_mig.planner import BlockedByBusyError, Instance, check_layout, plan_gpu


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


@dataclass
class Tally:
    """Counts for one model (or all of them)."""

    transitions: int = 0
    refused: int = 0
    # Transitions nodeagent carries out (not refused): both approaches change the GPU.
    na_destroyed: int = 0
    wipe_destroyed: int = 0
    wipe_busy: int = 0  # busy instances wipe destroys there (nodeagent destroys none)
    # The subset with no busy instance: both succeed without touching a busy instance.
    clean: int = 0
    clean_na: int = 0
    clean_wipe: int = 0
    # Refused transitions: wipe destroys everything; nodeagent only with --force.
    refused_wipe: int = 0
    refused_wipe_busy: int = 0
    refused_force: int = 0
    refused_force_busy: int = 0

    def add(self, other: Tally) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    @property
    def performed(self) -> int:
        return self.transitions - self.refused


def run_model(geometry: MigGeometry, seeds: int, busy_share: float) -> Tally:
    """Every ordered pair of distinct layouts, from seeded busy starts."""
    table = layouts(geometry)
    t = Tally()
    for seed in range(seeds):
        rng = random.Random(seed)
        for a, start in table.items():
            placed = plan_gpu(geometry, [], start).create
            current = [
                Instance(c.profile, c.placement, busy=rng.random() < busy_share, instance_id=i)
                for i, c in enumerate(placed)
            ]
            busy = sum(c.busy for c in current)
            for b, target in table.items():
                if a == b:
                    continue
                t.transitions += 1
                try:
                    plan = plan_gpu(geometry, current, target)
                except BlockedByBusyError:
                    t.refused += 1
                    t.refused_wipe += len(current)
                    t.refused_wipe_busy += busy
                    forced = plan_gpu(geometry, current, target, force=True)
                    t.refused_force += len(forced.destroy)
                    t.refused_force_busy += sum(d.busy for d in forced.destroy)
                    continue
                assert not any(d.busy for d in plan.destroy)
                t.na_destroyed += len(plan.destroy)
                t.wipe_destroyed += len(current)
                t.wipe_busy += busy
                if not busy:
                    t.clean += 1
                    t.clean_na += len(plan.destroy)
                    t.clean_wipe += len(current)
    return t


COLUMNS = (
    ("model", 11),
    ("trans", 5),
    ("refused", 7),
    ("| both do", 9),
    ("destroyed: na", 13),
    ("wipe", 5),
    ("(busy)", 6),
    ("| no busy", 9),
    ("na", 4),
    ("wipe", 5),
    ("| refused: wipe", 15),
    ("(busy)", 6),
    ("na --force (busy)", 17),
)


def row(label: str, t: Tally) -> str:
    values = (
        label,
        t.transitions,
        t.refused,
        t.performed,
        t.na_destroyed,
        t.wipe_destroyed,
        t.wipe_busy,
        t.clean,
        t.clean_na,
        t.clean_wipe,
        t.refused_wipe,
        t.refused_wipe_busy,
        f"{t.refused_force} ({t.refused_force_busy})",
    )
    cells = [f"{values[0]:<{COLUMNS[0][1]}}"]
    cells += [f"{v:>{w}}" for v, (_, w) in zip(values[1:], COLUMNS[1:], strict=True)]
    return " ".join(cells)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--busy", type=float, default=0.3)
    args = ap.parse_args()
    head = [f"{COLUMNS[0][0]:<{COLUMNS[0][1]}}"]
    head += [f"{name:>{w}}" for name, w in COLUMNS[1:]]
    print(" ".join(head))
    total = Tally()
    for label, geometry in geometries().items():
        t = run_model(geometry, args.seeds, args.busy)
        print(row(label, t))
        total.add(t)
    t = total
    print()
    print(
        f"all models: {t.transitions} transitions; nodeagent refuses {t.refused} "
        f"({t.refused / t.transitions:.0%}) because a busy instance blocks every plan"
    )
    print(
        f"the {t.performed} transitions both carry out: nodeagent destroyed "
        f"{t.na_destroyed} instances, none busy; wipe-and-recreate {t.wipe_destroyed} "
        f"({t.wipe_destroyed / max(t.na_destroyed, 1):.1f}x), {t.wipe_busy} of them busy"
    )
    print(
        f"  of which {t.clean} with no busy instance: nodeagent destroyed {t.clean_na}, "
        f"wipe-and-recreate {t.clean_wipe} ({t.clean_wipe / max(t.clean_na, 1):.1f}x)"
    )
    print(
        f"the {t.refused} refused transitions: nodeagent destroys nothing; wipe-and-recreate "
        f"destroys {t.refused_wipe} instances, {t.refused_wipe_busy} of them busy; "
        f"nodeagent --force would destroy {t.refused_force}, {t.refused_force_busy} of them busy"
    )


if __name__ == "__main__":
    main()
