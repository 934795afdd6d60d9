"""Churn: online MIG requests and releases on 8-GPU nodes, three placement policies.

    python bench/mig_churn.py [--seeds 3] [--events 3000]

Every policy serves a request only where it fits without touching running instances. Policies:
nodeagent (the planner's capacity-preserving choice, see mig.planner), lowest-free-slot
first-fit, and the driver-default heuristic the simulator models (size-1 profiles take the
last 1-slice slot if free, else the lowest free one; others the highest free legal placement),
both on the lowest-numbered GPU where the profile fits.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass

sys.path.insert(0, __file__.rsplit("/", 1)[0])

from mig_common import geometries

from mig.planner import NewInstance, capacity_key, fragmentation_ratio, memory_slices_of
from nodeagent.gpu.types import MigGeometry, Placement

GPUS = 8
Gpu = list[NewInstance]
Policy = Callable[[MigGeometry, list[Gpu], str], tuple[int, Placement] | None]


def _free(gpu: Gpu, pl: Placement) -> bool:
    return not any(pl.overlaps(i.placement) for i in gpu)


def _room(geometry: MigGeometry, gpu: Gpu, profile: str) -> list[Placement]:
    prof = geometry.profile(profile)
    assert prof is not None
    if sum(1 for i in gpu if i.profile == profile) >= prof.max_count:
        return []
    return [pl for pl in sorted(prof.placements, key=lambda p: p.start) if _free(gpu, pl)]


def first_fit(geometry: MigGeometry, node: list[Gpu], profile: str) -> tuple[int, Placement] | None:
    for g, gpu in enumerate(node):
        room = _room(geometry, gpu, profile)
        if room:
            return g, room[0]
    return None


def driver_default(
    geometry: MigGeometry, node: list[Gpu], profile: str
) -> tuple[int, Placement] | None:
    prof = geometry.profile(profile)
    assert prof is not None
    last = max(prof.placements, key=lambda p: p.start)
    for g, gpu in enumerate(node):
        room = _room(geometry, gpu, profile)
        if not room:
            continue
        if memory_slices_of(prof) == 1:
            return g, last if last in room else room[0]
        return g, room[-1]
    return None


def nodeagent(geometry: MigGeometry, node: list[Gpu], profile: str) -> tuple[int, Placement] | None:
    """The placement whose GPU loses the least capacity (largest profiles first); on ties the
    fuller GPU (packing), then the lowest GPU and start."""
    best: tuple[tuple[object, ...], int, Placement] | None = None
    for g, gpu in enumerate(node):
        room = _room(geometry, gpu, profile)
        if not room:
            continue
        before = capacity_key(geometry, gpu)
        used = sum(i.placement.size for i in gpu)
        for pl in room:
            after = capacity_key(geometry, [*gpu, NewInstance(profile, pl)])
            loss = tuple(b - a for b, a in zip(before, after, strict=True))
            key = (loss, -used, g, pl.start)
            if best is None or key < best[0]:
                best = (key, g, pl)
    return None if best is None else (best[1], best[2])


POLICIES: dict[str, Policy] = {
    "nodeagent": nodeagent,
    "first-fit": first_fit,
    "driver-default": driver_default,
}


@dataclass
class Event:
    time: float
    kind: str  # "arrive" | "leave"
    job: int
    profile: str


def trace(geometry: MigGeometry, load: float, events: int, seed: int) -> list[Event]:
    """Poisson arrivals, exponential holding times; offered load relative to node capacity."""
    rng = random.Random(seed)
    profiles = [p for p in geometry.profiles if "+" not in p.name]
    # Requests favour small profiles, as on shared inference/experiment pools.
    weights = [1.0 / memory_slices_of(p) for p in profiles]
    mean_slices = sum(w * memory_slices_of(p) for w, p in zip(weights, profiles, strict=True))
    mean_slices /= sum(weights)
    hold = 10.0
    rate = load * GPUS * geometry.memory_slices / (mean_slices * hold)
    out: list[Event] = []
    t = 0.0
    for job in range(events):
        t += rng.expovariate(rate)
        p = rng.choices(profiles, weights)[0].name
        out.append(Event(t, "arrive", job, p))
        out.append(Event(t + rng.expovariate(1 / hold), "leave", job, p))
    out.sort(key=lambda e: (e.time, e.kind == "arrive"))
    return out


def run(geometry: MigGeometry, events: list[Event], policy: Policy) -> tuple[float, float]:
    node: list[Gpu] = [[] for _ in range(GPUS)]
    where: dict[int, tuple[int, NewInstance]] = {}
    served = asked = 0
    frag: list[float] = []
    for e in events:
        if e.kind == "leave":
            if e.job in where:
                g, inst = where.pop(e.job)
                node[g].remove(inst)
            continue
        asked += 1
        spot = policy(geometry, node, e.profile)
        if spot is not None:
            inst = NewInstance(e.profile, spot[1])
            node[spot[0]].append(inst)
            where[e.job] = (spot[0], inst)
            served += 1
        frag.append(statistics.fmean(fragmentation_ratio(geometry, g) for g in node))
    return served / asked, statistics.fmean(frag)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--events", type=int, default=1500)
    ap.add_argument("--loads", default="0.6,0.9,1.2,1.5")
    args = ap.parse_args()
    loads = [float(x) for x in args.loads.split(",")]
    print(
        f"{'model':<11} {'load':>4} {'seed':>4}  {'served: nodeagent':>17} {'first-fit':>9} "
        f"{'driver':>7}   {'frag: nodeagent':>15} {'first-fit':>9} {'driver':>7}"
    )
    worse = 0
    totals = {name: 0.0 for name in POLICIES}
    traces = 0
    for m, (label, geometry) in enumerate(geometries().items()):
        for load in loads:
            for seed in range(args.seeds):
                events = trace(geometry, load, args.events, 1000 * m + seed)
                res = {name: run(geometry, events, pol) for name, pol in POLICIES.items()}
                na = res["nodeagent"][0]
                if na + 1e-12 < max(res["first-fit"][0], res["driver-default"][0]):
                    worse += 1
                for name in POLICIES:
                    totals[name] += res[name][0]
                traces += 1
                print(
                    f"{label:<11} {load:>4.1f} {seed:>4}  {res['nodeagent'][0]:>17.3f} "
                    f"{res['first-fit'][0]:>9.3f} {res['driver-default'][0]:>7.3f}   "
                    f"{res['nodeagent'][1]:>15.3f} {res['first-fit'][1]:>9.3f} "
                    f"{res['driver-default'][1]:>7.3f}"
                )
    mean = {k: v / traces for k, v in totals.items()}
    print()
    print(f"traces: {traces}; traces where nodeagent served fewer than a baseline: {worse}")
    for base in ("first-fit", "driver-default"):
        gain = (mean["nodeagent"] - mean[base]) / mean[base] * 100
        print(
            f"mean served share: nodeagent {mean['nodeagent']:.4f} vs {base} {mean[base]:.4f} "
            f"({gain:+.2f}%)"
        )


if __name__ == "__main__":
    main()
